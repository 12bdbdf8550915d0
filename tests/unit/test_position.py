"""app/cdc/position.py: each connector's source position becomes one string that sorts in source order.

Each test lists positions in their true source order, renders them through Spark, and checks that sorting the
strings (as Hudi's ordering comparison and the batch window do) gives back the true order. The inputs are
shuffled first so that an accidental pass-through of the input order cannot pass.
"""
from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import IntegerType, LongType, StringType, StructField, StructType

from app.cdc.position import (
    MYSQL,
    POSTGRESQL,
    SQLSERVER,
    connector_kind,
    position_column,
)
from app.errors import EnvelopeError

PG_SOURCE = StructType([StructField("lsn", LongType(), True)])
MYSQL_SOURCE = StructType([
    StructField("file", StringType(), True),
    StructField("pos", LongType(), True),
    StructField("row", IntegerType(), True),
])
SQLSERVER_SOURCE = StructType([
    StructField("commit_lsn", StringType(), True), StructField("change_lsn", StringType(), True),
    StructField("event_serial_no", LongType(), True),
])


def _rendered(
    spark: SparkSession, source_type: StructType, kind: str, ordered: list[tuple[Any, ...]], fields: Sequence[str] = ()
) -> list[str]:
    """The position strings of `ordered`, in the input's order."""
    rows = [(i, src) for i, src in enumerate(ordered)]
    random.Random(7).shuffle(rows)
    schema = StructType([StructField("i", IntegerType()), StructField("source", source_type)])
    df = spark.createDataFrame(rows, schema).select("i", position_column(F.col("source"), kind, fields).alias("p"))
    by_index = {r["i"]: r["p"] for r in df.collect()}
    return [by_index[i] for i in range(len(ordered))]


def _assert_sorts_in_order(rendered: list[str]) -> None:
    assert len(set(rendered)) == len(rendered), rendered
    assert sorted(rendered) == rendered, rendered
    assert len({len(p) for p in rendered}) == 1, f"not fixed width: {rendered}"


def test_postgres_lsn_sorts_across_byte_and_segment_boundaries(spark: SparkSession) -> None:
    lsns = [0, 1, 0x9, 0xA, 0xF, 0x10, 0xFF, 0x100, 0xFFFF, 0x1_0000, 0xFFFF_FFFF, 0x1_0000_0000,
            0x1_0000_0001, 0x1_FFFF_FFFF, 0x2_0000_0000, 0xA_0000_0000, 0xFF_FFFF_FFFF, 0x7FFF_FFFF_FFFF_FFFF]

    rendered = _rendered(spark, PG_SOURCE, POSTGRESQL, [(lsn,) for lsn in lsns])

    _assert_sorts_in_order(rendered)
    # PostgreSQL's own pg_lsn text, zero-padded: 0x1_0000_0001 is 1/1 there.
    assert rendered[lsns.index(0x1_0000_0001)] == "00000001/00000001:00000001/00000001"
    assert rendered[lsns.index(0xFF)] == "00000000/000000FF:00000000/000000FF"


PG_SEQUENCE_SOURCE = StructType([StructField("lsn", LongType(), True), StructField("sequence", StringType(), True)])


def test_postgres_incremental_snapshot_read_without_lsn_sorts_by_its_sequence(spark: SparkSession) -> None:
    # As Debezium 3.2 emits them (tests/e2e/test_quarantine_replay.py): a streamed update, then an incremental
    # snapshot's read of the same row, whose lsn is null and whose sequence holds the connector's position.
    events = [(72861128, '["72861072","72861128"]'), (None, '["73103032","73103032"]'), (73200000, None)]

    rendered = _rendered(spark, PG_SEQUENCE_SOURCE, POSTGRESQL, events, ["lsn", "sequence"])

    assert rendered == ["00000000/0457C590:00000000/0457C5C8", "00000000/045B76B8:00000000/045B76B8",
                        "00000000/045CF180:00000000/045CF180"]


def test_postgres_transaction_straddling_a_snapshot_chunk_sorts_after_its_read(spark: SparkSession) -> None:
    # As Debezium 3.2 emitted them (recorded on the local stack): a transaction updated row 120 at LSN 124531296,
    # before an incremental snapshot's chunk read the row (its old value) and emitted the read at 124535560; the
    # transaction committed after that, so its update streams after the read with the lower LSN. Its sequence's
    # first LSN, the commit streamed before it, is higher than the read's: the update is the newer version.
    ordered = [
        (124531200, '["124531104","124531200"]'),  # a change streamed before the chunk
        (None, '["124535560","124535560"]'),  # the chunk's read of row 120
        (124531296, '["124537392","124531296"]'),  # the straddling transaction's update of row 120
        (124537496, '["124537440","124537496"]'),  # the next transaction's
        (124673616, '["124673616","124673616"]'),  # a blocking snapshot's read
        (124673680, '["124673616","124673680"]'),  # the first change streamed after the blocking snapshot
    ]

    _assert_sorts_in_order(_rendered(spark, PG_SEQUENCE_SOURCE, POSTGRESQL, ordered, ["lsn", "sequence"]))


def test_postgres_snapshot_reads_before_the_first_commit_sort_by_their_lsn(spark: SparkSession) -> None:
    # An initial snapshot's reads and the first transaction streamed after a connector's start carry no commit
    # in their sequence ([null, "<lsn>"]): their LSN stands in, and the next commit orders after both.
    ordered = [(124719664, '[null,"124719664"]'), (124719704, '[null,"124719704"]'),
               (124720184, '["124720184","124720184"]'), (124720190, '["124720184","124720190"]')]

    _assert_sorts_in_order(_rendered(spark, PG_SEQUENCE_SOURCE, POSTGRESQL, ordered, ["lsn", "sequence"]))


def test_postgres_position_matches_pg_lsn_text_for_a_real_lsn(spark: SparkSession) -> None:
    # select '16/B374D848'::pg_lsn - '0/0' = 97500059720
    (rendered,) = _rendered(spark, PG_SOURCE, POSTGRESQL, [(97500059720,)])
    assert rendered == "00000016/B374D848:00000016/B374D848"


def test_mysql_binlog_file_rollover_position_and_row(spark: SparkSession) -> None:
    ordered = [
        ("mysql-bin.000009", 4, 0),
        ("mysql-bin.000009", 154, 0),
        ("mysql-bin.000009", 154, 1),
        ("mysql-bin.000009", 154, 10),  # row 10 after row 9..: decimal padding, not text order
        ("mysql-bin.000009", 999, 0),
        ("mysql-bin.000009", 1000, 0),
        ("mysql-bin.000009", 4294967296, 0),  # positions past 4 GiB
        ("mysql-bin.000010", 4, 0),  # rollover: the next file starts again at a low position
        ("mysql-bin.000099", 4, 0),
        ("mysql-bin.000100", 4, 0),
        ("mysql-bin.999999", 4, 0),
        ("mysql-bin.1000000", 4, 0),  # the suffix grows a digit after 999999
    ]

    rendered = _rendered(spark, MYSQL_SOURCE, MYSQL, ordered)

    _assert_sorts_in_order(rendered)
    assert rendered[1] == "0000000009:00000000000000000154:0000000000"


def test_mysql_snapshot_event_without_row_sorts_first_at_its_position(spark: SparkSession) -> None:
    ordered = [("mariadb-bin.000003", 385, None), ("mariadb-bin.000003", 385, 1)]

    _assert_sorts_in_order(_rendered(spark, MYSQL_SOURCE, MYSQL, ordered))


def test_sqlserver_commit_lsn_change_lsn_and_serial(spark: SparkSession) -> None:
    ordered = [
        ("0000002c:00000190:0003", None, None),  # a snapshot event: no change_lsn, no serial
        ("0000002c:00000190:0003", "0000002c:00000188:0002", 1),
        ("0000002c:00000190:0003", "0000002c:00000188:0002", 2),
        ("0000002c:00000190:0003", "0000002c:00000188:0002", 10),
        ("0000002c:00000190:0003", "0000002c:0000018a:0002", 1),  # hex digits a-f after 9
        ("0000002c:00000190:0004", "0000002c:00000190:0004", 1),
        ("0000002c:000001ff:ffff", "0000002c:000001ff:fffe", 1),
        ("0000002d:00000000:0001", "0000002d:00000000:0001", 1),  # VLF boundary
        ("000000ff:ffffffff:ffff", "000000ff:ffffffff:ffff", 1),
        ("00000100:00000000:0000", "00000100:00000000:0000", 1),  # byte boundary of the first segment
    ]

    rendered = _rendered(spark, SQLSERVER_SOURCE, SQLSERVER, ordered)

    _assert_sorts_in_order(rendered)
    assert rendered[0] == "0000002C:00000190:0003:00000000:00000000:0000:00000000000000000000"


def test_sqlserver_upper_and_lower_case_lsns_render_the_same(spark: SparkSession) -> None:
    lower, upper = _rendered(
        spark, SQLSERVER_SOURCE, SQLSERVER,
        [
            ("0000002c:000001a0:000b", "0000002c:000001a0:000b", 5),
            ("0000002C:000001A0:000B", "0000002C:000001A0:000B", 5),
        ],
    )
    assert lower == upper


@pytest.mark.parametrize(
    ("fields", "kind"),
    [
        (["version", "connector", "lsn", "txId", "xmin", "sequence"], POSTGRESQL),
        (["version", "connector", "file", "pos", "row", "gtid", "server_id"], MYSQL),
        (["version", "connector", "change_lsn", "commit_lsn", "event_serial_no"], SQLSERVER),
    ],
)
def test_connector_kind_from_the_source_record(fields: list[str], kind: str) -> None:
    assert connector_kind(fields) == kind


def test_connector_kind_refuses_a_source_without_position() -> None:
    with pytest.raises(EnvelopeError, match="no position fields"):
        connector_kind(["version", "connector", "ts_ms"])
