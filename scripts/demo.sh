#!/usr/bin/env bash
# README command 1: on a fresh machine, install what is missing, start the local stack, and run the demo
# (TICKIT in PostgreSQL -> Debezium -> Kafka -> the streaming job -> Hudi, checked against the source).
# The stack keeps running afterwards for exploration; stop it with scripts/stack.sh down.
# usage: scripts/demo.sh [--scale X] [--burst N]
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
case ${1:-} in -h|--help) sed -n '2,5p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;; esac
# Set-up's and the stack's own output go to a log file; the terminal gets a line per step (and the log's tail on
# a failure).
log=.stack/logs/demo-setup.log
mkdir -p .stack/logs
step() {
  echo "[demo] $1 (log: $log) ..."
  shift
  "$@" >>"$log" 2>&1 || { tail -n 20 "$log"; echo "[demo] FAILED: $*; see $log"; exit 1; }
}
: >"$log"
step "installing what is missing" scripts/setup.sh
step "starting the local stack" scripts/stack.sh up
export METASTORE_PASSWORD=${METASTORE_PASSWORD:-postgres}
# The stack's S3 server takes any key; these only apply when no AWS credentials are set.
export AWS_ACCESS_KEY_ID=${AWS_ACCESS_KEY_ID:-local} AWS_SECRET_ACCESS_KEY=${AWS_SECRET_ACCESS_KEY:-local}
exec .venv/bin/python scripts/demo.py "$@"
