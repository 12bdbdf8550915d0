#!/usr/bin/env bash
# spark-submit app/main.py locally with the project's jars from .deps/spark: the local equivalent of an EMR step.
# Under spark-submit the driver JVM starts before app/main.py runs, so the jars go on the command line
# (--jars for the session, --driver-class-path so the metastore's JDBC driver is visible to DataNucleus).
# usage: scripts/submit.sh --conf conf/local.yaml [--available-now]
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
jars=$(ls "$ROOT"/.deps/spark/*.jar | paste -sd, -)
classpath=${jars//,/:}
export PATH="$ROOT/.venv/bin:$PATH" PYSPARK_PYTHON="$ROOT/.venv/bin/python"
export METASTORE_PASSWORD=${METASTORE_PASSWORD:-postgres}
# The stack's S3 server takes any key; these only apply when no AWS credentials are set.
export AWS_ACCESS_KEY_ID=${AWS_ACCESS_KEY_ID:-local} AWS_SECRET_ACCESS_KEY=${AWS_SECRET_ACCESS_KEY:-local}
exec spark-submit --driver-memory "${DRIVER_MEMORY:-3g}" --jars "$jars" --driver-class-path "$classpath" \
  "$ROOT/app/main.py" "$@"
