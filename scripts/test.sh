#!/usr/bin/env bash
# README command 2: the whole test suite on a fresh machine.
# Installs what is missing, starts the local stack (unless it already runs), runs lint, type check and
# pytest, and stops the stack it started, also when tests fail.
# usage: scripts/test.sh [pytest args...]       e.g.  scripts/test.sh -m "not slow"
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
start=$SECONDS
scripts/setup.sh
# Leave a stack the developer already runs as it is; stop only what this script starts.
started_here=1
status=$(scripts/stack.sh status)
if grep -q '^kafka *running' <<<"$status"; then started_here=0; fi
cleanup() {
  [ "$started_here" = 1 ] || return 0
  # CI leaves nothing behind: its stack's state (some of it outside the clone) is wiped, not just stopped.
  if [ "${CI:-}" = true ]; then scripts/stack.sh reset; else scripts/stack.sh down; fi
}
trap cleanup EXIT
scripts/stack.sh up
echo "[test] ruff"; .venv/bin/ruff check app scripts tests
echo "[test] mypy"; .venv/bin/mypy
echo "[test] pytest"
# Under a non-UTC zone on purpose: no conversion may depend on the machine's time zone.
export TZ=America/Los_Angeles
export METASTORE_PASSWORD=${METASTORE_PASSWORD:-postgres}
rc=0
.venv/bin/pytest "$@" || rc=$?
echo "[test] finished in $((SECONDS - start))s (exit $rc)"
exit $rc
