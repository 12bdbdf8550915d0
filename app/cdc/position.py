"""The ordering column: one fixed-width string per event that sorts in source order, for every connector.

Hudi compares the precombine field of two versions of a record (`EVENT_TIME_ORDERING`) with the value's own
`compareTo`; for a string that is a character-by-character comparison. Each connector's position is therefore
rendered as zero-padded, fixed-width fields of digits (hexadecimal in upper case, or decimal), so that string
order equals position order within one connector. A table is fed by one connector, so positions of different
connectors are never compared; their widths differ and that is fine. The type never changes: `string`.

    PostgreSQL   source.sequence[0], source.lsn               "CCCCCCCC/CCCCCCCC:XXXXXXXX/XXXXXXXX"
                                                              (two LSNs as PostgreSQL prints them, zero-padded)
                 The first LSN is the last commit the connector had streamed before the event (`sequence`'s
                 first element), the second the event's own: changes stream in commit order, and the commit
                 LSN orders them so. The event's own LSN alone does not: a transaction that began before an
                 incremental snapshot's chunk and commits after it carries LSNs lower than the chunk's reads,
                 yet changed the rows after the reads were taken. A read has no lsn: `sequence`'s second LSN
                 (the connector's position when it emitted the read) stands in. Without `sequence` (an unwrap
                 SMT that did not add it), and on events before the connector's first streamed commit (its
                 first element is null), the event's LSN stands in for the commit's.
    MySQL/MariaDB source.file, pos, row                       "FFFFFFFFFF:PPPPPPPPPPPPPPPPPPPP:RRRRRRRRRR"
                                                              (binlog file index, position, row, decimal)
    SQL Server   source.commit_lsn, change_lsn, event_serial_no
                                                              "CCCCCCCC:CCCCCCCC:CCCC:XXXXXXXX:XXXXXXXX:XXXX:
                                                               SSSSSSSSSSSSSSSSSSSS" (the 10-byte LSNs as SQL
                                                               Server prints them, then the serial, decimal)

Which connector wrote an event is read off its writer schema's `source` record (`lsn`, `file`/`pos`/`row`,
`commit_lsn`), not configured. A missing field (a snapshot event's SQL Server change_lsn, say) counts as zero:
snapshot events sort before the streamed changes of the same commit.
"""
from __future__ import annotations

from collections.abc import Collection
from typing import Final

from pyspark.sql import Column
from pyspark.sql import functions as F

from app.errors import EnvelopeError

POSTGRESQL: Final = "postgresql"
MYSQL: Final = "mysql"
SQLSERVER: Final = "sqlserver"

_SQLSERVER_ZERO_LSN: Final = "00000000:00000000:0000"
# A source's `connector` setting (app/config/model.py) -> the position its events carry.
CONNECTOR_KINDS: Final = {"postgresql": POSTGRESQL, "mysql": MYSQL, "mariadb": MYSQL, "sqlserver": SQLSERVER}


def connector_kind(source_fields: Collection[str]) -> str:
    """Which connector's position the envelope's `source` record carries.

    Raises:
        EnvelopeError: none of the known position fields is present.
    """
    fields = set(source_fields)
    if {"commit_lsn", "change_lsn", "event_serial_no"} <= fields:  # Db2 and Informix lack the serial
        return SQLSERVER
    if {"file", "pos", "row"} <= fields:
        return MYSQL
    if "lsn" in fields:
        return POSTGRESQL
    raise EnvelopeError(
        f"the envelope's source record has no position fields (lsn; file/pos/row; commit_lsn/change_lsn): "
        f"{sorted(fields)}"
    )


def position_column(source: Column, kind: str, fields: Collection[str] = ()) -> Column:
    """The ordering string of one event, from the envelope's `source` struct (whose field names are `fields`)."""
    if kind == POSTGRESQL:
        lsn = source["lsn"].cast("long")
        committed = lsn
        if "sequence" in fields:  # ["<last commit LSN>", "<LSN>"], set also on an incremental snapshot's reads
            sequence = source["sequence"]
            lsn = F.coalesce(lsn, F.get_json_object(sequence, "$[1]").cast("long"))
            committed = F.coalesce(F.get_json_object(sequence, "$[0]").cast("long"), lsn)
        return F.concat(postgres_position(committed), F.lit(":"), postgres_position(lsn))
    if kind == MYSQL:
        return mysql_position(source["file"], source["pos"], source["row"])
    if kind == SQLSERVER:
        return sqlserver_position(source["commit_lsn"], source["change_lsn"], source["event_serial_no"])
    raise ValueError(f"unknown connector kind {kind!r}")


def postgres_position(lsn: Column) -> Column:
    """`XXXXXXXX/XXXXXXXX`: the 64-bit LSN as 16 upper-case hex digits, split like PostgreSQL's pg_lsn text."""
    digits = F.lpad(F.hex(F.coalesce(lsn.cast("long"), F.lit(0).cast("long"))), 16, "0")
    return F.concat(F.substring(digits, 1, 8), F.lit("/"), F.substring(digits, 9, 8))


def mysql_position(file: Column, pos: Column, row: Column) -> Column:
    """`file index:position:row`, decimal, zero-padded to 10, 20 and 10 digits.

    The binlog file's numeric suffix orders files (`mysql-bin.000009` < `mysql-bin.000010`, and past
    `.999999` the suffix grows a digit, which the padding absorbs); the base name is left out: it is fixed for a
    server (`log_bin`), and renaming it restarts numbering anyway.
    """
    index = F.regexp_extract(F.coalesce(file, F.lit("")), r"\.(\d+)$", 1)
    index = F.when(index == "", F.lit("0")).otherwise(index)
    return F.concat_ws(
        ":",
        F.lpad(index.cast("decimal(20,0)").cast("string"), 10, "0"),
        F.lpad(F.coalesce(pos.cast("decimal(20,0)"), F.lit(0)).cast("string"), 20, "0"),
        F.lpad(F.coalesce(row.cast("long"), F.lit(0)).cast("string"), 10, "0"),
    )


def sqlserver_position(commit_lsn: Column, change_lsn: Column, serial: Column) -> Column:
    """`commit_lsn:change_lsn:serial`: the LSNs as SQL Server prints them (`0000002c:00000190:0003`, fixed
    width hex), upper-cased, and the event serial number as 20 decimal digits."""
    return F.concat_ws(
        ":",
        F.upper(F.coalesce(commit_lsn, F.lit(_SQLSERVER_ZERO_LSN))),
        F.upper(F.coalesce(change_lsn, F.lit(_SQLSERVER_ZERO_LSN))),
        F.lpad(F.coalesce(serial.cast("long"), F.lit(0)).cast("string"), 20, "0"),
    )
