#!/usr/bin/env bash
# Build the job, upload it beside its config to S3 and add it to a running EMR cluster as a step.
#
# Target: EMR 7.11-7.13 (Spark 3.5.6, Hudi 1.0.2, Scala 2.12, Java 17, Amazon Linux 2023): the newest EMR line
# on Spark 3.5, the line this project builds and tests against (pyspark 3.5.6, hudi-spark3.5-bundle 1.0.2), so
# the cluster's own Hudi bundle, EMRFS and Glue client are used as they are. emr-spark-8 (Spark 4, Hudi 1.1,
# Scala 2.13) would need other jars throughout. The cluster's python3 is 3.9: create the cluster with
# bootstrap.sh (Python 3.11 and the job's pins), which this script uploads.
#
# What lands under --s3-root: cdc_lakehouse.zip, main.py, requirements.txt, cdc-functions.jar (scripts/package.sh;
# the jar holds the JVM functions the job calls for numeric over 38 digits and bit(n)), conf.yaml (your filled copy
# of conf/prod.yaml), bootstrap.sh, jars/ (deps/jvm-artifacts.txt set emr: Kafka source, Avro, MSK IAM).
# The step is scripts/emr/step.json with @S3_ROOT@ filled in, written to build/package/step.json; its --jars name
# the cluster's Hudi bundle, cdc-functions.jar and jars/*.jar.
#
# usage: scripts/emr/deploy.sh --cluster-id j-XXXX --s3-root s3://bucket/cdc-lakehouse --conf my-prod.yaml
#          [--registry-secret-id ID] [--available-now] [--restarts N] [--restart-delay S] [--dry-run] [--out DIR]
#   --registry-secret-id  a Secrets Manager secret holding the registry's client secret: the step exports it as
#                         REGISTRY_CLIENT_SECRET for the driver (the step shows the id, never the secret)
#   --available-now       process what Kafka holds, then end (without it the step runs until cancelled)
#   --restarts N          the continuous step's restart policy: a job that ends with any exit but 0 or 2 (a config
#                         error) is started again from its checkpoint after --restart-delay seconds (default 60),
#                         up to N times in a row (default 10; a run of an hour or more starts the count again);
#                         0: never. It brings back a killed driver, an out-of-memory kill, an outage past the job's
#                         give-up time (docs/running.md "Restart policy")
#   --dry-run             print every command (and the step) instead of running it
#   --out DIR             where the package and the step are built (default build/package)
# A new cluster (printed at the end, not run): aws emr create-cluster --release-label emr-7.13.0
#   --applications Name=Spark Name=Hadoop Name=Hive
#   --configurations '[{"Classification":"spark-hive-site","Properties":{"hive.metastore.client.factory.class":
#     "com.amazonaws.glue.catalog.metastore.AWSGlueDataCatalogHiveClientFactory"}}]'
#   --bootstrap-actions Path=<s3-root>/bootstrap.sh,Args=[<s3-root>/requirements.txt] ...
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
OUT="$ROOT/build/package"
cluster="" s3_root="" conf="" secret_id="" available_now=0 dry_run=0 restarts=10 restart_delay=60
while (($#)); do
  case $1 in
    --cluster-id) cluster=$2; shift 2 ;;
    --s3-root) s3_root=${2%/}; shift 2 ;;
    --conf) conf=$2; shift 2 ;;
    --registry-secret-id) secret_id=$2; shift 2 ;;
    --available-now) available_now=1; shift ;;
    --restarts) restarts=$2; shift 2 ;;
    --restart-delay) restart_delay=$2; shift 2 ;;
    --dry-run) dry_run=1; shift ;;
    --out) OUT=$2; shift 2 ;;
    -h|--help) sed -n '2,32p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "unknown argument: $1 (see --help)" >&2; exit 2 ;;
  esac
done
[[ -n $cluster && -n $s3_root && -n $conf ]] || { echo "--cluster-id, --s3-root and --conf are required (see --help)" >&2; exit 2; }
[[ $restarts =~ ^[0-9]+$ && $restart_delay =~ ^[0-9]+$ ]] || { echo "--restarts and --restart-delay take whole numbers" >&2; exit 2; }
[[ $s3_root == s3://* ]] || { echo "--s3-root must be an s3:// URI, got $s3_root" >&2; exit 2; }
[[ -f $conf ]] || { echo "no config file $conf" >&2; exit 2; }
if sed 's/#.*//' "$conf" | grep -nE '<[a-z][a-z0-9-]*>' >&2; then
  echo "$conf still has <placeholders> (above): fill them in first" >&2
  exit 2
fi

run() {
  if ((dry_run)); then
    printf '%q ' "$@"; echo
  else
    "$@"
  fi
}

run bash "$ROOT/scripts/package.sh" --out "$OUT"
run python3 "$ROOT/scripts/fetch_jars.py" emr
run aws emr describe-cluster --cluster-id "$cluster" --query Cluster.ReleaseLabel --output text
for file in cdc_lakehouse.zip main.py requirements.txt cdc-functions.jar; do
  run aws s3 cp "$OUT/$file" "$s3_root/$file"
done
run aws s3 cp "$conf" "$s3_root/conf.yaml"
run aws s3 cp "$ROOT/scripts/emr/bootstrap.sh" "$s3_root/bootstrap.sh"
run aws s3 cp --recursive "$ROOT/.deps/emr" "$s3_root/jars/" --exclude '*' --include '*.jar'

mkdir -p "$OUT"
python3 - "$ROOT/scripts/emr/step.json" "$OUT/step.json" "$s3_root" "$available_now" "$secret_id" "$restarts" \
  "$restart_delay" <<'EOF'
import json
import sys

template, out, s3_root, available_now, secret_id, restarts, delay = sys.argv[1:]
# The restart policy (--restarts): the job again, from its checkpoint, unless it ended well (0) or its config is
# wrong (2); a run of an hour or more starts the count again.
RESTART = (
    'n=0; while :; do started=$SECONDS; "$@"; rc=$?; '
    '[ $rc -eq 0 ] || [ $rc -eq 2 ] && exit $rc; '
    '[ $((SECONDS - started)) -ge 3600 ] && n=0; n=$((n + 1)); '
    '[ $n -gt {restarts} ] && {{ echo "[restart] the job exited $rc, {restarts} restarts in a row: giving up" >&2; exit $rc; }}; '
    'echo "[restart] the job exited $rc; starting it again from its checkpoint in {delay} s (restart $n of {restarts})" >&2; '
    'sleep {delay}; done'
)
steps = json.loads(open(template).read().replace("@S3_ROOT@", s3_root))
for step in steps:
    if available_now == "1":
        step["Args"].append("--available-now")
    # bash -c SCRIPT $0 "$@": $0 names the step (or the secret's id), spark-submit and its arguments are "$@".
    run = "exec \"$@\""
    if available_now != "1" and int(restarts) > 0:
        run = RESTART.format(restarts=int(restarts), delay=int(delay))
    if secret_id:
        script = ('export REGISTRY_CLIENT_SECRET="$(aws secretsmanager get-secret-value --secret-id "$0" '
                  '--query SecretString --output text)" && ' + run)
        step["Args"] = ["bash", "-c", script, secret_id, *step["Args"]]
    elif run != "exec \"$@\"":
        step["Args"] = ["bash", "-c", run, "cdc-lakehouse", *step["Args"]]
open(out, "w").write(json.dumps(steps, indent=2) + "\n")
EOF
((dry_run)) && cat "$OUT/step.json"
run aws emr add-steps --cluster-id "$cluster" --steps "file://$OUT/step.json"
if ((dry_run)); then
  echo "# a new cluster for it: aws emr create-cluster --release-label emr-7.13.0 ..." \
    "--bootstrap-actions Path=$s3_root/bootstrap.sh,Args=[$s3_root/requirements.txt] (see --help)"
fi
