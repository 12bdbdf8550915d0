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
conf="" prev="" available_now=""
for arg in "$@"; do
  case $arg in
    --conf=*) conf=${arg#--conf=} ;;
    --available-now) available_now=1 ;;
    *) [ "$prev" = --conf ] && conf=$arg ;;
  esac
  prev=$arg
done
# The driver JVM's options likewise: the config's spark.conf."spark.driver.extraJavaOptions", then its
# spark.class_archive's when that file exists, then for --available-now its spark.available_now_java_options when
# the topics' records are within their limit (app/spark.py driver_java_options, app/job.py use_available_now_options),
# or for a stream its spark.stream_java_options.
# A config that does not load gives neither: the job then says what is wrong with it. The count's line goes to
# stderr, as the job's own lines do.
memory=${DRIVER_MEMORY:-} java_options=""
if [ -f "$conf" ]; then
  { read -r config_memory; read -r java_options; } < <(PYTHONPATH="$ROOT" "$ROOT/.venv/bin/python" - "$conf" "$available_now" <<'PY' || true
import sys

from app.config import load_config
from app.job import use_available_now_options
from app.main import configure_logging
from app.spark import driver_java_options

try:
    config = load_config(sys.argv[1])
except Exception:  # an invalid config: the job says what is wrong with it, and exits 2
    sys.exit(0)
configure_logging(config.log_level)
print(config.spark.conf.get("spark.driver.memory", ""))
quick = use_available_now_options(config, bool(sys.argv[2]))
print(driver_java_options(config.spark, with_available_now_options=quick, stream=not sys.argv[2]))
PY
) || true
  memory=${memory:-${config_memory:-}}
fi
launch=(--driver-memory "${memory:-3g}")
[ -z "$java_options" ] || launch+=(--driver-java-options "$java_options")
exec spark-submit "${launch[@]}" --jars "$jars" --driver-class-path "$classpath" "$ROOT/app/main.py" "$@"
