#!/usr/bin/env bash
# Build the deployable job into one folder (default build/package/):
#   cdc_lakehouse.zip  the app/ package, for spark-submit --py-files (Spark puts a .zip on sys.path, not a .whl)
#   main.py            the entry script (app/main.py; outside the package it leaves sys.path alone)
#   requirements.txt   the pinned runtime dependencies of setup.cfg, less pyspark (the cluster's Spark brings its own)
#   cdc-functions.jar  the job's JVM functions (jvm/; app/cdc/debezium_types.py calls them with `reflect` for numeric over 38
#                      digits and bit(n)), for spark-submit --jars; built by scripts/setup.sh jvm when jvm/ changed
#   cdc-connect.jar    the Kafka Connect SMT io.cdclake.connect.DefaultsAsParameters, for the Debezium connector's
#                      plugin folder, not for Spark (docs/schema-changes.md "A NULL in a column with a default")
# Then, from any working directory (the Kafka, Avro and Hudi jars besides):
#   spark-submit --jars <out>/cdc-functions.jar --py-files <out>/cdc_lakehouse.zip <out>/main.py --conf <path | s3://...>
# The files may as well be on S3 (scripts/emr/deploy.sh uploads them).
# usage: scripts/package.sh [--out DIR]
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT="$ROOT/build/package"
while (($#)); do
  case $1 in
    --out) OUT=$2; shift 2 ;;
    -h|--help) sed -n '2,13p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "unknown argument: $1 (see --help)" >&2; exit 2 ;;
  esac
done
PYTHON=${PYTHON:-python3}
mkdir -p "$OUT"
"$PYTHON" - "$ROOT" "$OUT" <<'EOF'
import configparser
import sys
import zipfile
from pathlib import Path

root, out = Path(sys.argv[1]), Path(sys.argv[2])
# Fixed timestamps: the same sources give the same zip, byte for byte.
with zipfile.ZipFile(out / "cdc_lakehouse.zip", "w", zipfile.ZIP_DEFLATED) as zf:
    for path in sorted((root / "app").rglob("*.py")):
        info = zipfile.ZipInfo(str(path.relative_to(root)), date_time=(1980, 1, 1, 0, 0, 0))
        info.compress_type = zipfile.ZIP_DEFLATED
        info.external_attr = 0o644 << 16
        zf.writestr(info, path.read_bytes())
(out / "main.py").write_bytes((root / "app" / "main.py").read_bytes())
cfg = configparser.ConfigParser()
cfg.read(root / "setup.cfg")
pins = [line.strip() for line in cfg["options"]["install_requires"].splitlines()]
pins = [p for p in pins if p and not p.startswith("#") and not p.lower().startswith("pyspark")]
(out / "requirements.txt").write_text("".join(f"{p}\n" for p in pins))
EOF
bash "$ROOT/scripts/setup.sh" jvm
cp "$ROOT/.deps/spark/cdc-functions.jar" "$OUT/cdc-functions.jar"
cp "$ROOT/.deps/connect/cdc-connect.jar" "$OUT/cdc-connect.jar"
ls -l "$OUT"
