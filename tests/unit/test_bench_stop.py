"""The bench stopped by SIGTERM cleans up as on Ctrl-C (scripts/bench/run.py `stop_on_sigterm`)."""
from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# What the bench's scenarios do around their sources: cleanup in `finally` (and context managers' __exit__).
PROGRAM = """
import os, signal, sys, time
from scripts.bench.run import stop_on_sigterm
stop_on_sigterm()
try:
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(30)
finally:
    open(sys.argv[1], "w").write("cleaned up")
"""


def test_sigterm_runs_the_bench_cleanup_and_exits_143(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    done = subprocess.run([sys.executable, "-c", PROGRAM, str(marker)], check=False, cwd=ROOT, timeout=120,
                          capture_output=True, text=True)
    assert done.returncode == 128 + signal.SIGTERM, done.stderr
    assert marker.read_text() == "cleaned up"
