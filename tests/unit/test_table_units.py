"""A batch's table units beside Bronze (app/batch/processor.py `TableUnits`, `BronzeGate`): each unit plans its table
while Bronze is written, and none writes to the lake before Bronze is complete. The units' plans and writes are
stand-ins that record what happened when; the threads and the gate are the job's."""
from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

import pytest
from pyspark.sql import SparkSession

from app.batch.plan import TablePlan, TableTopics
from app.batch.processor import BronzeGate, BronzeNotWritten, TableUnits, kept_records
from app.batch.writer import Step, TableWriter
from app.hooks import Hooks

TABLES = [TableTopics(f"lake.t{n}", "lake", (f"src.s.t{n}",)) for n in range(4)]


@dataclass
class Recorder:
    """What the units did, in order: ("plan", table), ("read", table), ("write", table); ("bronze", "")."""

    events: list[tuple[str, str]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, kind: str, table: str = "") -> None:
        with self.lock:
            self.events.append((kind, table))

    def index(self, kind: str, table: str = "") -> int:
        return self.events.index((kind, table))


@dataclass
class Plan:
    """Stands in for a TablePlan: the unit only passes it to the writer and reads its table's name."""

    name: str


class Writer:
    """Stands in for TableWriter.write: a read, then the gate, then a write; `fail` names tables whose write raises."""

    def __init__(self, recorder: Recorder, fail: Callable[[str], Exception | None] = lambda _: None) -> None:
        self.recorder, self.fail = recorder, fail

    def write(self, plan: Any, batch_id: int, query_id: str, step: Step, ready: Callable[[], None]) -> None:
        self.recorder.add("read", plan.name)
        ready()
        error = self.fail(plan.name)
        if error is not None:
            raise error
        self.recorder.add("write", plan.name)


def units(recorder: Recorder, writer: Writer, plan: Callable[[TableTopics], Any] | None = None) -> TableUnits:
    def planned(table: TableTopics) -> Any:
        recorder.add("plan", table.name)
        return Plan(table.name)

    return TableUnits(TABLES, cast(Callable[[TableTopics], TablePlan], plan or planned), 7, "query",
                      writer=cast(TableWriter, writer), hooks=Hooks())


def run(table_units: TableUnits, writers: int) -> None:
    threads = [threading.Thread(target=table_units.write) for _ in range(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    table_units.bronze.join()


def test_units_plan_and_read_while_bronze_is_written_and_write_only_after_it() -> None:
    recorder = Recorder()
    two_read = threading.Event()  # set once two units have planned and read: Bronze ends only then
    released: list[bool] = []

    class ReadingWriter(Writer):
        def write(self, plan: Any, batch_id: int, query_id: str, step: Step, ready: Callable[[], None]) -> None:
            self.recorder.add("read", plan.name)
            if sum(kind == "read" for kind, _ in self.recorder.events) == 2:
                two_read.set()
            ready()
            self.recorder.add("write", plan.name)

    def bronze() -> None:
        released.append(two_read.wait(30))
        recorder.add("bronze")

    table_units = units(recorder, ReadingWriter(recorder))
    table_units.bronze = BronzeGate(bronze)
    run(table_units, 2)

    assert table_units.failure() is None and released == [True]
    bronze_at = recorder.index("bronze")
    assert recorder.index("read", "lake.t0") < bronze_at and recorder.index("read", "lake.t1") < bronze_at
    writes = [n for n, (kind, _) in enumerate(recorder.events) if kind == "write"]
    assert len(writes) == len(TABLES) and min(writes) > bronze_at
    assert [cast(Any, p).name for p in table_units.plans()] == [t.name for t in TABLES]


def test_a_failed_bronze_write_stops_every_unit_before_its_first_write_and_is_the_batchs_error() -> None:
    recorder = Recorder()
    table_units = units(recorder, Writer(recorder))

    def bronze() -> None:
        raise OSError("the bucket is gone")

    table_units.bronze = BronzeGate(bronze)
    run(table_units, 2)

    assert not [e for e in recorder.events if e[0] == "write"]
    assert all(isinstance(e, BronzeNotWritten) for e, _ in table_units.failures)
    failure = table_units.failure()
    assert failure is not None
    error, step = failure
    assert isinstance(error, OSError) and (step.table, step.name) == (None, "bronze")


def test_of_several_failed_units_the_first_tables_error_is_the_batchs() -> None:
    recorder = Recorder()
    both_failing = threading.Barrier(2, timeout=30)

    def fail(table: str) -> Exception | None:
        if table == "lake.t1":
            both_failing.wait()
            return KeyError("t1 fails first in time")
        if table == "lake.t0":
            both_failing.wait()
            threading.Event().wait(0.2)
            return ValueError("t0 is the first table")
        return None

    table_units = units(recorder, Writer(recorder, fail))
    run(table_units, 2)

    failure = table_units.failure()
    assert failure is not None
    error, step = failure
    assert isinstance(error, ValueError) and step.table == "lake.t0"
    assert len(table_units.failures) == 2
    assert not [e for e in recorder.events if e[0] == "plan" and e[1] in ("lake.t2", "lake.t3")]  # none started after


def test_a_units_plan_error_names_its_table_and_the_plan_step() -> None:
    recorder = Recorder()

    def plan(table: TableTopics) -> Any:
        if table.name == "lake.t0":
            raise ValueError("no such writer schema")
        return Plan(table.name)

    table_units = units(recorder, Writer(recorder), plan)
    run(table_units, 1)

    failure = table_units.failure()
    assert failure is not None
    error, step = failure
    assert isinstance(error, ValueError) and (step.table, step.name) == ("lake.t0", "plan")
    assert not recorder.events  # the only writer thread stopped at its first table


def test_an_open_gate_lets_units_write_at_once() -> None:
    gate = BronzeGate(None)
    gate.wait()
    gate.join()
    assert gate.error is None and gate.seconds == 0.0


def test_the_gate_times_bronze_and_raises_for_each_waiting_unit() -> None:
    gate = BronzeGate(lambda: threading.Event().wait(0.05))
    gate.wait()
    gate.join()
    assert gate.error is None and gate.seconds >= 0.05

    failing = BronzeGate(lambda: 1 / 0)
    for _ in range(2):
        with pytest.raises(BronzeNotWritten, match="ZeroDivisionError"):
            failing.wait()


def test_a_batchs_records_are_kept_in_a_partition_per_core_each_kafka_partition_whole(spark: SparkSession) -> None:
    # Seven Kafka partitions (as a micro-batch reads them: a Spark partition each) on a session of two cores.
    schema = "topic string, partition int, offset long"
    rows = [(f"t{p}", p, offset) for p in range(7) for offset in range(5)]
    batch_df = spark.createDataFrame(rows, schema).repartition(7, "partition")
    few_df = spark.createDataFrame(spark.sparkContext.parallelize(rows[:5], 1), schema)  # one Kafka partition

    kept_df, few_kept_df = kept_records(batch_df), kept_records(few_df)
    try:
        assert kept_df.rdd.getNumPartitions() == spark.sparkContext.defaultParallelism == 2
        assert few_kept_df.rdd.getNumPartitions() == 1
        assert kept_df.is_cached
        assert sorted(kept_df.collect()) == sorted(batch_df.collect())
        spread = kept_df.rdd.mapPartitionsWithIndex(lambda i, it: ((i, r.partition) for r in it)).distinct().collect()
        assert sorted(p for _, p in spread) == list(range(7))  # each Kafka partition in one Spark partition only
    finally:
        kept_df.unpersist()
        few_kept_df.unpersist()
