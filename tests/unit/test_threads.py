"""Calls made side by side (app/spark.py `in_threads`): how a batch builds its topics' decode plans, and Bronze beside
them (app/batch/processor.py)."""
from __future__ import annotations

import threading
from functools import partial

import pytest
from pyspark.sql import SparkSession

from app.spark import in_threads


def test_calls_run_side_by_side_and_their_results_keep_the_calls_order() -> None:
    barrier = threading.Barrier(3, timeout=30)  # broken (an error) unless the three calls wait at once

    def call(n: int) -> int:
        barrier.wait()
        return n * 10

    assert in_threads([partial(call, n) for n in range(3)], 3) == [0, 10, 20]


def test_more_calls_than_workers_all_run_on_that_many_threads() -> None:
    threads: set[int] = set()

    def call(n: int) -> int:
        threads.add(threading.get_ident())
        return n

    assert in_threads([partial(call, n) for n in range(7)], 2) == list(range(7))
    assert 1 <= len(threads) <= 2 and threading.get_ident() not in threads


def test_every_call_runs_and_the_first_calls_error_is_raised() -> None:
    ran: list[int] = []
    barrier = threading.Barrier(2, timeout=30)

    def call(n: int) -> int:
        if n == 2:
            barrier.wait()  # the later error happens first
            raise KeyError("second")
        if n == 1:
            barrier.wait()
            threading.Event().wait(0.2)
            raise ValueError("first")
        ran.append(n)
        return n

    with pytest.raises(ValueError, match="first"):
        in_threads([partial(call, n) for n in range(4)], 2)
    assert sorted(ran) == [0, 3]


def test_one_worker_calls_one_after_another_on_the_callers_thread() -> None:
    seen: list[tuple[int, int]] = []

    def call(n: int) -> int:
        seen.append((n, threading.get_ident()))
        if n == 1:
            raise ValueError("stops here")
        return n

    with pytest.raises(ValueError):
        in_threads([partial(call, n) for n in range(3)], 1)
    assert seen == [(0, threading.get_ident()), (1, threading.get_ident())]


def test_each_thread_gets_the_callers_local_properties(spark: SparkSession) -> None:
    context = spark.sparkContext
    context.setLocalProperty("cdc.test.batch", "b7")
    try:
        got = in_threads([lambda: context.getLocalProperty("cdc.test.batch")] * 3, 3)
    finally:
        context.setLocalProperty("cdc.test.batch", None)  # type: ignore[arg-type]
    assert got == ["b7"] * 3
