"""The job as a process of its own (and JVM), started with pause points armed (devkit/pauses.py) and killed with
SIGKILL: the crash tests' tools."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tests.conftest import ROOT, TESTING_JAR


class Job:
    """The job as its own process (and JVM), killed with SIGKILL."""

    def __init__(self, conf: Path, folder: Path) -> None:
        self.conf = conf
        self.folder = folder
        self.runs = 0

    def start(
        self, points: str = "", available_now: bool = False, conf: Path | None = None,
        table: str = "",  # the table whose Hudi commits `hudi_commit` pauses in (devkit/pauses.py); "": any
    ) -> subprocess.Popen[bytes]:
        self.runs += 1
        self.started = time.monotonic()
        pauses = self.folder / f"pauses-{self.runs}"
        pauses.mkdir()
        env = {**os.environ, "CDC_PAUSE_AT": points, "CDC_PAUSE_DIR": str(pauses), "CDC_PAUSE_TABLE": table,
               # the pause points inside Hudi (jvm/ io.cdclake.testing): Spark's launcher puts it last on the class
               # path, after the config's `spark.jars_dir` and Spark's own jars
               "SPARK_DIST_CLASSPATH": str(TESTING_JAR)}
        # The job with the pause points as its hooks (devkit/pauses.py).
        args = [sys.executable, "-m", "devkit.pauses", "--conf", str(conf or self.conf)]
        args += ["--available-now"] if available_now else []
        self.log = self.folder / f"job-{self.runs}.log"
        return subprocess.Popen(
            args, cwd=ROOT, env=env, stdout=self.log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True
        )

    def pause_file(self, point: str) -> Path:
        return self.folder / f"pauses-{self.runs}" / f"{point}.json"

    def log_lines(self) -> list[str]:
        return self.log.read_text(errors="replace").splitlines()


def wait(condition: Any, process: subprocess.Popen[bytes], timeout_s: float, what: str, job: Job) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if process.poll() is not None:
            raise AssertionError(f"the job ended ({process.returncode}) waiting for {what}:\n"
                                 + "\n".join(job.log_lines()[-30:]))
        if time.monotonic() > deadline:
            return None
        time.sleep(0.1)


def kill(process: subprocess.Popen[bytes]) -> None:
    os.killpg(process.pid, signal.SIGKILL)
    process.wait(60)
