#!/usr/bin/env bash
# spark-submit app/main.py locally with the project's jars from .deps/spark: the local equivalent of an EMR step.
# Under spark-submit the driver JVM starts before app/main.py runs, so the jars go on the command line
# (--jars for the session, --driver-class-path so the metastore's JDBC driver is visible to DataNucleus).
# The driver's memory: DRIVER_MEMORY if set, else the config's spark.conf."spark.driver.memory" (spark-submit starts
# the driver before the job reads its config, so the job's session cannot set it), else 3g.
# usage: [DRIVER_MEMORY=4g] scripts/submit.sh --conf conf/local.yaml [--available-now]
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
jars=$(ls "$ROOT"/.deps/spark/*.jar | paste -sd, -)
classpath=${jars//,/:}
export PATH="$ROOT/.venv/bin:$PATH" PYSPARK_PYTHON="$ROOT/.venv/bin/python"
export METASTORE_PASSWORD=${METASTORE_PASSWORD:-postgres}
# The stack's S3 server takes any key; these only apply when no AWS credentials are set.
export AWS_ACCESS_KEY_ID=${AWS_ACCESS_KEY_ID:-local} AWS_SECRET_ACCESS_KEY=${AWS_SECRET_ACCESS_KEY:-local}
conf="" prev=""
for arg in "$@"; do
  case $arg in --conf=*) conf=${arg#--conf=} ;; *) [ "$prev" = --conf ] && conf=$arg ;; esac
  prev=$arg
done
memory=${DRIVER_MEMORY:-}
if [ -z "$memory" ] && [ -f "$conf" ]; then
  memory=$("$ROOT/.venv/bin/python" - "$conf" <<'PY' 2>/dev/null || true
import sys, yaml
raw = yaml.safe_load(open(sys.argv[1])) or {}
print(((raw.get("spark") or {}).get("conf") or {}).get("spark.driver.memory", ""))
PY
)
fi
exec spark-submit --driver-memory "${memory:-3g}" --jars "$jars" --driver-class-path "$classpath" \
  "$ROOT/app/main.py" "$@"
