"""A PostgreSQL schema of the benchmark's own, captured by a Debezium connector of its own (envelopes, the tests'
framing), and the configs that point the job or the naive baseline (scripts/bench/naive.py) at its topics.

Tables `t0 .. t<n-1>`: (id bigint primary key, tx bigint, v text, qty int), each seeded with `seed_rows` rows.
On leaving, the connector, its replication slot and publication, the schema and the topics are removed.
"""
from __future__ import annotations

import os
import re
import sys
import tempfile
import time
import uuid
from pathlib import Path
from types import TracebackType
from typing import Any

import psycopg
import yaml
from confluent_kafka import Consumer, KafkaException, TopicPartition
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from app.cdc.columns import SOFT_DELETED_COL
from devkit.connect import (
    ConnectClient,
    PostgresSource,
    delete_topics,
    drop_replication_slot,
    postgres_connector_config,
)

PG_DSN = "host=127.0.0.1 port=5432 user=postgres password={password} dbname=source"
CONNECT_URL = "http://127.0.0.1:8083"


class BenchSource:
    """The schema, its tables and its connector (module docstring); a context manager."""

    def __init__(self, label: str, tables: int, seed_rows: int, registry_url: str, bootstrap: str) -> None:
        run = f"{label}{uuid.uuid4().hex[:6]}{tables}"
        self.tables, self.seed_rows, self.bootstrap = tables, seed_rows, bootstrap
        self.schema, self.prefix, self.name = f"b{run}", f"b{run}", f"bench-{run}"
        self.password = os.environ.get("PGPASSWORD", "postgres")
        self.dsn = PG_DSN.format(password=self.password)
        self.connect = ConnectClient(CONNECT_URL)
        self.connector = postgres_connector_config(
            self.name, PostgresSource("127.0.0.1", 5432, "postgres", self.password, "source"), self.prefix,
            [self.schema], registry_url,
        )
        self.conn: psycopg.Connection[Any] | None = None

    @property
    def table_names(self) -> list[str]:
        return [f"t{n}" for n in range(self.tables)]

    @property
    def topics(self) -> list[str]:
        return [f"{self.prefix}.{self.schema}.{t}" for t in self.table_names]

    @property
    def topic_pattern(self) -> str:
        return re.escape(self.prefix) + r"\.[^.]+\.[^.]+"

    def __enter__(self) -> BenchSource:
        self.conn = psycopg.connect(self.dsn, autocommit=True)
        try:
            self.conn.execute(f"create schema {self.schema}")
            for table in self.table_names:
                self.conn.execute(f"create table {self.schema}.{table} (id bigint primary key, tx bigint, v text, "
                                  "qty int)")
                self.conn.execute(f"insert into {self.schema}.{table} select i, 0, 'seed ' || i, i "
                                  f"from generate_series(1, {self.seed_rows}) i")
            self.connect.create_fresh(self.name, self.connector)
            self.connect.wait_running(self.name)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        conn = self.conn
        if conn is None:
            return
        self.connect.delete_connector(self.name, reset_offsets=True)
        drop_replication_slot(conn, self.connector["slot.name"])
        conn.execute(f"drop publication if exists {self.connector['publication.name']}")
        conn.execute(f"drop schema if exists {self.schema} cascade")
        conn.close()
        self.conn = None
        try:
            delete_topics(self.bootstrap, (f"{self.prefix}.",))
        except (KafkaException, RuntimeError) as e:  # left on the broker: not worth hiding the run's own outcome
            print(f"warning: {self.prefix}.* topics not deleted: {e}", file=sys.stderr)

    def execute(self, sql: str) -> None:
        if self.conn is None:
            raise RuntimeError("the source is not open")
        self.conn.execute(sql)

    def records(self) -> int:
        """Records on the schema's topics now (each has one partition; the connector writes no transactions)."""
        consumer = Consumer({"bootstrap.servers": self.bootstrap, "group.id": f"bench-{uuid.uuid4().hex[:6]}"})
        try:
            total = 0
            for topic in self.topics:
                try:
                    _, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
                except KafkaException:  # a topic the connector has not created yet
                    high = 0
                total += max(high, 0)
            return total
        finally:
            consumer.close()

    def wait_for_records(self, count: int, timeout_s: float = 900.0) -> int:
        deadline = time.monotonic() + timeout_s
        while (found := self.records()) < count:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.prefix}: {found} records on its topics after {timeout_s:.0f} s, "
                                   f"expected {count}")
            time.sleep(2)
        return found

    def job_config(self, config_file: str, root: str, database: str, trigger_s: float = 1.0) -> dict[str, Any]:
        """`config_file` (the shipped config) pointed at this source's topics and a lake under `root`."""
        raw = yaml.safe_load(Path(config_file).read_text())
        raw["kafka"].update({"topic_pattern": self.topic_pattern})
        raw.pop("sources", None)
        raw.pop("tables", None)
        raw["source"] = {"topic_prefix": self.prefix, "framing": "id4", "id_type": "contentId"}
        raw["lake"].update({"database": database, "silver_path": f"{root}/silver", "bronze_path": f"{root}/bronze",
                            "checkpoint_path": f"{root}/checkpoint"})
        raw["trigger"] = {"processing_time": f"{trigger_s:g} second"}
        return raw

    def consumer(self, side: str, config_file: str, root: str, database: str, *, available_now: bool
                 ) -> tuple[list[str], dict[str, str], Path]:
        """The command that reads this source's topics into a lake under `root` (run from the repository root):
        the job (`side` "job", app/main.py, catalog database `database`) or the naive baseline ("naive",
        scripts/bench/naive.py), `--available-now` or with a 1-second trigger; the Silver path of each table; the
        config file written for it (the caller removes it)."""
        conf = Path(tempfile.mkstemp(suffix=".yaml")[1])
        if side == "job":
            conf.write_text(yaml.safe_dump(self.job_config(config_file, root, database)))
            command = [sys.executable, "app/main.py", "--conf", str(conf)]
            paths = {t: f"{root}/silver/{database}/{self.schema}_{t}" for t in self.table_names}
            return command + (["--available-now"] if available_now else []), paths, conf
        conf.write_text(Path(config_file).read_text())
        command = [sys.executable, "scripts/bench/naive.py", "--conf", str(conf), "--root", root,
                   *(["--available-now"] if available_now else ["--trigger-s", "1"]),
                   *[a for topic in self.topics for a in ("--topic", topic)]]
        return command, {t: f"{root}/silver/{t}" for t in self.table_names}, conf

    def differences(self, spark: SparkSession, paths: dict[str, str]) -> list[str]:
        """Tables whose Silver copy ({table: path}) differs from PostgreSQL on (id, tx, v, qty), updates and
        deletes included; each named with the number of rows on one side only."""
        if self.conn is None:
            raise RuntimeError("the source is not open")
        differ = []
        for table, path in paths.items():
            table_df = spark.read.format("hudi").load(path)
            if SOFT_DELETED_COL in table_df.columns:  # lake.delete_mode: soft keeps deleted rows, flagged
                table_df = table_df.filter(~F.col(SOFT_DELETED_COL))
            silver = {tuple(r) for r in table_df.select("id", "tx", "v", "qty").collect()}
            source = {tuple(r) for r in self.conn.execute(f"select id, tx, v, qty from {self.schema}.{table}")}
            if silver != source:
                differ.append(f"{table}: {len(silver - source)} rows only in Silver, {len(source - silver)} only "
                              "in PostgreSQL")
        return differ
