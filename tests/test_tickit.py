"""scripts/tickit.py against the local PostgreSQL: each test gets its own scratch database, dropped afterwards.

Only the databases are needed (not Kafka or Connect), so these tests do not use the `stack` fixture; they are
marked `stack` because they need the servers scripts/stack.sh runs (PostgreSQL, and MariaDB for the reference
placement).
"""
from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pymysql
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo
from psycopg.rows import TupleRow

from scripts import tickit
from tests.support.cdc import MARIADB_ROOT, PG_DSN

pytestmark = pytest.mark.stack

Conn = psycopg.Connection[TupleRow]
SCALE = 0.2

# Every id column that refers to another table, as (child table, column, parent table, parent key).
REFERENCES = [
    ("ems.event", "venueid", "ems.venue", "venueid"),
    ("ems.event", "catid", "ems.category", "catid"),
    ("ems.event", "dateid", "ecomm.date", "dateid"),
    ("ecomm.listing", "sellerid", "crm.users", "userid"),
    ("ecomm.listing", "eventid", "ems.event", "eventid"),
    ("ecomm.listing", "dateid", "ecomm.date", "dateid"),
    ("ecomm.sales", "listid", "ecomm.listing", "listid"),
    ("ecomm.sales", "sellerid", "crm.users", "userid"),
    ("ecomm.sales", "buyerid", "crm.users", "userid"),
    ("ecomm.sales", "eventid", "ems.event", "eventid"),
    ("ecomm.sales", "dateid", "ecomm.date", "dateid"),
]


def _table(name: str) -> sql.Identifier:
    schema, table = name.split(".")
    return sql.Identifier(schema, table)


def _scalar(conn: Conn, query: sql.Composed | str, params: tuple[object, ...] = ()) -> Any:
    row = conn.execute(query, params or None).fetchone()
    assert row is not None
    return row[0]


@pytest.fixture
def tickit_db() -> Iterator[Conn]:
    """An autocommit connection to a fresh database `tickit_test_<random>` holding the (empty) TICKIT schema."""
    name = f"tickit_test_{uuid.uuid4().hex[:12]}"
    admin_dsn = make_conninfo(PG_DSN, dbname="postgres")
    with psycopg.connect(admin_dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        with psycopg.connect(make_conninfo(PG_DSN, dbname=name), autocommit=True) as conn:
            tickit.create_schema(conn)
            yield conn
    finally:
        with psycopg.connect(admin_dsn, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def _duplicate_keys(conn: Conn, table: str) -> int:
    keys = sql.SQL(", ").join(map(sql.Identifier, tickit.PRIMARY_KEYS[table]))
    query = sql.SQL("SELECT count(*) - count(DISTINCT ({})) FROM {}").format(keys, _table(table))
    return int(_scalar(conn, query))


def _dangling_references(conn: Conn) -> dict[str, int]:
    dangling: dict[str, int] = {}
    for child, column, parent, key in REFERENCES:
        query = sql.SQL("SELECT count(*) FROM {} c WHERE NOT EXISTS (SELECT 1 FROM {} p WHERE p.{} = c.{})").format(
            _table(child), _table(parent), sql.Identifier(key), sql.Identifier(column))
        n = int(_scalar(conn, query))
        if n:
            dangling[f"{child}.{column}"] = n
    return dangling


def _checksum(conn: Conn, table: str) -> str:
    query = sql.SQL("SELECT md5(string_agg(t::text, '|' ORDER BY t::text)) FROM {} t").format(_table(table))
    return str(_scalar(conn, query))


def test_create_schema_has_the_declared_keys_and_full_replica_identity(tickit_db: Conn) -> None:
    tickit.create_schema(tickit_db)  # idempotent: a second run changes nothing and does not fail

    for table in tickit.TABLES:
        keys = tickit_db.execute(
            """SELECT a.attname FROM pg_index i
               JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)
               WHERE i.indrelid = %s::regclass AND i.indisprimary ORDER BY a.attnum""", (table,)).fetchall()
        assert [k[0] for k in keys] == tickit.PRIMARY_KEYS[table], table
        assert _scalar(tickit_db, "SELECT relreplident FROM pg_class WHERE oid = %s::regclass", (table,)) == "f"
    assert tickit.counts(tickit_db) == dict.fromkeys(tickit.TABLES, 0)


def test_load_inserts_what_it_reports_with_unique_keys(tickit_db: Conn) -> None:
    loaded = tickit.load(tickit_db, scale=SCALE)

    assert loaded == {t: max(1, round(n * SCALE)) for t, n in tickit.BASE_ROWS.items()}
    assert tickit.counts(tickit_db) == loaded
    assert {t: _duplicate_keys(tickit_db, t) for t in tickit.TABLES} == dict.fromkeys(tickit.TABLES, 0)
    assert _dangling_references(tickit_db) == {}
    # Values the CDC path has to carry: NULLs, two-decimal money, microsecond timestamps.
    assert _scalar(tickit_db, "SELECT count(*) FROM crm.users WHERE likesports IS NULL") != 0
    assert _scalar(tickit_db, "SELECT count(*) FROM ecomm.sales WHERE extract(microseconds FROM saletime) "
                              "::bigint % 1000 <> 0") != 0
    assert _scalar(tickit_db, "SELECT count(*) FROM ecomm.listing WHERE priceperticket < 0 OR totalprice < 0") == 0
    with pytest.raises(ValueError, match="not empty"):
        tickit.load(tickit_db, scale=SCALE)


def test_load_is_deterministic_for_a_seed(tickit_db: Conn) -> None:
    tickit.load(tickit_db, scale=SCALE, seed=3)
    first = {t: _checksum(tickit_db, t) for t in tickit.TABLES}
    tickit.drop(tickit_db)
    tickit.create_schema(tickit_db)
    tickit.load(tickit_db, scale=SCALE, seed=3)

    assert {t: _checksum(tickit_db, t) for t in tickit.TABLES} == first


def test_burst_changes_counts_by_inserted_minus_deleted(tickit_db: Conn) -> None:
    tickit.load(tickit_db, scale=SCALE)
    before = tickit.counts(tickit_db)

    changes = tickit.burst(tickit_db, n=60)

    after = tickit.counts(tickit_db)
    assert after == {t: before[t] + changes[t]["insert"] - changes[t]["delete"] for t in tickit.TABLES}
    changed = [t for t, c in changes.items() if any(c.values())]
    assert len(changed) >= 4, changes
    for op in ("insert", "update", "delete", "rekey"):
        assert sum(c[op] for c in changes.values()) > 0, op
    # Listing updates include one row repriced three times in the same transaction.
    assert changes["ecomm.listing"]["update"] >= 3
    assert _scalar(tickit_db, "SELECT count(*) FROM crm.users WHERE phone IS NULL") != 0
    assert {t: _duplicate_keys(tickit_db, t) for t in tickit.TABLES} == dict.fromkeys(tickit.TABLES, 0)
    assert _dangling_references(tickit_db) == {}


def test_reference_placement_splits_systems_over_postgresql_and_mariadb(tickit_db: Conn) -> None:
    """crm and ems in PostgreSQL, ecomm in MariaDB (renamed, so runs never share a database): load, burst, and
    the same invariants as in one database, checked across the two."""
    ecomm = f"ecomm_{uuid.uuid4().hex[:8]}"
    maria = pymysql.connect(**MARIADB_ROOT, autocommit=True)
    placement = tickit.Placement.reference(tickit_db, maria, {"ecomm": ecomm})
    try:
        tickit.drop(tickit_db)  # the fixture created all three systems in PostgreSQL
        tickit.create_schema(placement)
        loaded = tickit.load(placement, scale=SCALE)
        changes = tickit.burst(placement, n=60)

        after = tickit.counts(placement)
        assert after == {t: loaded[t] + changes[t]["insert"] - changes[t]["delete"] for t in tickit.TABLES}
        assert changes["ecomm.sales"]["insert"] > 0 and changes["ecomm.listing"]["rekey"] > 0
        with maria.cursor() as cur:
            cur.execute(f"SELECT count(*) FROM `{ecomm}`.`sales`")
            assert cur.fetchone()[0] == after["ecomm.sales"]
        # ecomm is no longer in PostgreSQL: only crm and ems were created there.
        assert _scalar(tickit_db, "SELECT count(*) FROM information_schema.tables WHERE table_schema = 'ecomm'") == 0
        sellers = {r[0] for r in placement.db("ecomm.listing").rows(f"SELECT sellerid FROM `{ecomm}`.listing")}
        users = {r[0] for r in tickit_db.execute("SELECT userid FROM crm.users").fetchall()}
        assert sellers <= users  # a user deleted or rekeyed by the burst had no listings
    finally:
        tickit.drop(placement)
        maria.close()
