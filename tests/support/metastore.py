"""Read the Hive metastore's own tables in its PostgreSQL database: what Athena, Presto or a plain Hive client
see, not what a Hudi-aware Spark session reads from the table's files."""
from __future__ import annotations

import psycopg

from tests.support.cdc import PG_DSN

METASTORE_DSN = PG_DSN.replace("dbname=source", "dbname=metastore")


def metastore_table(database: str, table: str) -> tuple[str, str, list[str]] | None:
    """(table type, storage location, column names in order) of a registered table, or None."""
    with psycopg.connect(METASTORE_DSN) as conn:
        row = _registered(conn, database, table)
        if row is None:
            return None
        return str(row[0]), str(row[1]), [name for name, _ in _columns(conn, row[2])]


def _registered(conn: psycopg.Connection, database: str, table: str) -> tuple[str, str, int] | None:
    """(table type, storage location, column descriptor id) of a registered table, or None."""
    row = conn.execute(
        'select t."TBL_TYPE", s."LOCATION", s."CD_ID" from "TBLS" t '
        'join "DBS" d on d."DB_ID" = t."DB_ID" join "SDS" s on s."SD_ID" = t."SD_ID" '
        'where d."NAME" = %s and t."TBL_NAME" = %s',
        (database.lower(), table.lower()),
    ).fetchone()
    return None if row is None else (str(row[0]), str(row[1]), int(row[2]))


def _columns(conn: psycopg.Connection, cd_id: int) -> list[tuple[str, str]]:
    """A column descriptor's (name, Hive type) pairs, in order."""
    rows = conn.execute(
        'select "COLUMN_NAME", "TYPE_NAME" from "COLUMNS_V2" where "CD_ID" = %s order by "INTEGER_IDX"', (cd_id,)
    ).fetchall()
    return [(str(name), str(type_)) for name, type_ in rows]


def metastore_partitions(database: str, table: str) -> list[str]:
    """The partition names (`field=value`) registered for a table, sorted."""
    with psycopg.connect(METASTORE_DSN) as conn:
        rows = conn.execute(
            'select p."PART_NAME" from "PARTITIONS" p join "TBLS" t on t."TBL_ID" = p."TBL_ID" '
            'join "DBS" d on d."DB_ID" = t."DB_ID" where d."NAME" = %s and t."TBL_NAME" = %s',
            (database.lower(), table.lower()),
        ).fetchall()
    return sorted(str(r[0]) for r in rows)


def metastore_column_types(database: str, table: str) -> dict[str, str]:
    """The registered table's columns and their Hive types (`decimal(12,2)`, `bigint`, ...); {} when absent."""
    with psycopg.connect(METASTORE_DSN) as conn:
        row = _registered(conn, database, table)
        return {} if row is None else dict(_columns(conn, row[2]))
