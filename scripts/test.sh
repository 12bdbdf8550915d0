#!/usr/bin/env bash
# README command 2: the whole test suite on a fresh machine.
# Installs what is missing, starts the local stack (unless it already runs), runs lint, type check and
# pytest, and stops the stack it started, also when tests fail.
# usage: [TEST_WORKERS=N] scripts/test.sh [--no-stack] [pytest args...]   e.g.  scripts/test.sh -m "not slow"
#   --no-stack  the pure tests only (-m "not stack"): no stack is started; installs the Spark jars and the Python env
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
case ${1:-} in
  -h|--help) sed -n '2,6p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
  --no-stack)
    shift
    JAR_SETS=spark scripts/setup.sh jars python
    export TZ=America/Los_Angeles
    exec .venv/bin/pytest -n "${TEST_WORKERS:-2}" -m "not stack" "$@" ;;
esac
start=$SECONDS
scripts/setup.sh system jars python s3  # the class archive (cds) below, while the stack starts
echo "[test] ruff"; .venv/bin/ruff check app devkit scripts tests
echo "[test] mypy"; .venv/bin/mypy
# Services the developer already runs stay as they are; only those this script starts are stopped.
running=$(scripts/stack.sh status | awk '$2 == "running" {print $1}')
started=""
for name in postgres mariadb kafka registry connect s3 spark; do
  grep -q -x -F "$name" <<<"$running" || started="$started $name"
done
cleanup() {
  [ -n "$started" ] || return 0
  # CI leaves nothing behind: its stack's state (some of it outside the clone) is wiped, not just stopped.
  if [ "${CI:-}" = true ] && [ -z "$running" ]; then scripts/stack.sh reset; else scripts/stack.sh down $started; fi
}
trap cleanup EXIT
# The JVMs the tests start (each worker's Spark, the job processes, spark-submit) live seconds to minutes: C1 only
# and the serial collector spend about a third less CPU on them here (the stack's services keep their own flags).
# C1 alone gets a 48 MB code cache by default, which a worker's long-lived Spark driver fills: its code-cache sweeper
# then flushes and its compiler recompiles all the time (a third of the partitions module's CPU went that way), so it
# gets the 240 MB of the default mode. The JDK's own SAX parser named up front: the AWS SDK makes one per S3 listing,
# and finding it otherwise searches every jar on the class path each time.
jvm_flags=${JAVA_TOOL_OPTIONS:-"-XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=240m -XX:+UseSerialGC \
-Dorg.xml.sax.driver=com.sun.org.apache.xerces.internal.parsers.SAXParser"}
# The Spark drivers' class-data sharing archive (devkit/cds.py), made (when stale) while the stack starts.
JAVA_TOOL_OPTIONS=$jvm_flags scripts/setup.sh cds > .deps/cds.out 2>&1 & cds_pid=$!
scripts/stack.sh up
cds_rc=0; wait "$cds_pid" || cds_rc=$?
cat .deps/cds.out
if [[ $cds_rc != 0 ]]; then echo "[test] cds archive not made: the drivers start without it"; fi
echo "[test] pytest"
# Under a non-UTC zone on purpose: no conversion may depend on the machine's time zone.
export TZ=America/Los_Angeles
export METASTORE_PASSWORD=${METASTORE_PASSWORD:-postgres}
# The stack's S3 server takes any key; these only apply when no AWS credentials are set.
export AWS_ACCESS_KEY_ID=${AWS_ACCESS_KEY_ID:-local} AWS_SECRET_ACCESS_KEY=${AWS_SECRET_ACCESS_KEY:-local}
rc=0
# The slowest tests and the time per module are printed on every run (tests/conftest.py). The modules run on
# TEST_WORKERS pytest-xdist workers at once, longest first (tests/support/parallel.py); TEST_WORKERS=0: one process.
workers=${TEST_WORKERS:-3}
export JAVA_TOOL_OPTIONS="$jvm_flags $(.venv/bin/python -m devkit.cds --options)"
.venv/bin/pytest --durations=25 -n "$workers" "$@" || rc=$?
echo "[test] finished in $((SECONDS - start))s (exit $rc)"
exit $rc
