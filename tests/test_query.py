"""scripts/query.py: Spark SQL on the lake through the job's session settings, on the real metastore."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import LOCAL_CONF, ROOT

pytestmark = [pytest.mark.stack]


def _query(*statements: str) -> subprocess.CompletedProcess[str]:
    args = [a for s in statements for a in ("-e", s)]
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "query.py"), "--conf", str(LOCAL_CONF), *args],
                          capture_output=True, text=True, timeout=300, check=False, cwd=ROOT,
                          env={**os.environ, "METASTORE_PASSWORD": os.environ.get("METASTORE_PASSWORD", "postgres")})


def test_query_shows_results_and_names_an_sql_error(stack: None) -> None:
    out = _query("select 6 * 7 as answer", "show databases")
    assert out.returncode == 0, out.stderr[-2000:]
    assert "|answer|" in out.stdout and "|42    |" in out.stdout
    assert "default" in out.stdout

    bad = _query("select * from no_such_database.no_such_table")
    assert bad.returncode == 1 and "error:" in bad.stderr and "no_such" in bad.stderr
