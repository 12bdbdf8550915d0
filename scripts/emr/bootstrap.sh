#!/usr/bin/env bash
# EMR bootstrap action: the job's Python 3.11 on every node, at /opt/cdc-lakehouse/python (the interpreter
# scripts/emr/step.json names for the driver and the executors).
#
# EMR 7.x runs Amazon Linux 2023, whose default python3 is 3.9; the job needs 3.11 (setup.cfg python_requires).
# AL2023 packages python3.11. A venv keeps the job's pins (requirements.txt from scripts/package.sh: setup.cfg's
# install_requires less pyspark, which the cluster's Spark 3.5.6 provides) apart from the system's packages.
# The nodes need PyPI (a NAT gateway, or PIP_INDEX_URL set to a mirror in the same shell).
#
# usage (create-cluster): --bootstrap-actions Path=<s3-root>/bootstrap.sh,Args=[<s3-root>/requirements.txt]
set -euo pipefail
case ${1:-} in -h|--help) sed -n '2,10p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;; esac
REQUIREMENTS=${1:?usage: bootstrap.sh s3://<bucket>/<prefix>/requirements.txt}
VENV=/opt/cdc-lakehouse/python

sudo dnf install -y python3.11 python3.11-pip
sudo python3.11 -m venv "$VENV"
aws s3 cp "$REQUIREMENTS" /tmp/cdc-lakehouse-requirements.txt
sudo "$VENV/bin/python" -m pip install --no-cache-dir --upgrade pip
sudo "$VENV/bin/python" -m pip install --no-cache-dir -r /tmp/cdc-lakehouse-requirements.txt
# Fail the bootstrap (and the cluster start) here, not the first step, when an import is missing.
"$VENV/bin/python" -c 'import sys, boto3, requests, yaml; assert sys.version_info[:2] == (3, 11), sys.version'
