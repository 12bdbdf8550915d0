#!/usr/bin/env python3
"""TICKIT sample data for the CDC source: create the schema, load rows, make a burst of changes, count, drop.

The schema is `schemas/tickit.sql` (REFERENCE.md section 7: TICKIT's columns plus primary keys, split into the
`ecomm`, `ems` and `crm` schemas, every table with REPLICA IDENTITY FULL). Data is generated, not downloaded:
everything is drawn from `random.Random(seed)`, so the same seed on the same database state gives the same rows
and the same changes.

Usable as a module (`from scripts import tickit`) and as a CLI that prints JSON:

    python scripts/tickit.py create
    python scripts/tickit.py load --scale 1.0 --seed 7
    python scripts/tickit.py burst --n 100 --seed 11
    python scripts/tickit.py counts
    python scripts/tickit.py drop

Standard library and psycopg only, so it runs from the project's virtualenv without Spark.
Every function that writes runs in `conn.transaction()`: on an autocommit connection (what the CLI opens) that is
its own transaction, committed on success; inside a caller's open transaction it is a savepoint and the caller
commits.
"""
from __future__ import annotations

import argparse
import calendar
import datetime as dt
import json
import logging
import os
import random
import re
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo
from psycopg.rows import TupleRow

log = logging.getLogger(__name__)

Conn = psycopg.Connection[TupleRow]
Row = tuple[Any, ...]

SCHEMA_FILE = Path(__file__).resolve().parent.parent / "schemas" / "tickit.sql"
MARIADB_SCHEMA_FILE = SCHEMA_FILE.with_name("tickit-mariadb.sql")
DEFAULT_DSN = "host=127.0.0.1 port=5432 user=postgres password=postgres dbname=source"
SCHEMAS = ["ecomm", "ems", "crm"]

# Dependency order: dimensions first, so a reader replaying inserts in this order never meets a dangling id.
TABLES = ["crm.users", "ems.venue", "ems.category", "ecomm.date", "ems.event", "ecomm.listing", "ecomm.sales"]
PRIMARY_KEYS: dict[str, list[str]] = {
    "crm.users": ["userid"],
    "ems.venue": ["venueid"],
    "ems.category": ["catid"],
    "ecomm.date": ["dateid"],
    "ems.event": ["eventid"],
    "ecomm.listing": ["listid"],
    "ecomm.sales": ["salesid"],
}
COLUMNS: dict[str, list[str]] = {
    "crm.users": [
        "userid", "username", "firstname", "lastname", "city", "state", "email", "phone",
        "likesports", "liketheatre", "likeconcerts", "likejazz", "likeclassical", "likeopera", "likerock",
        "likevegas", "likebroadway", "likemusicals",
    ],
    "ems.venue": ["venueid", "venuename", "venuecity", "venuestate", "venueseats"],
    "ems.category": ["catid", "catgroup", "catname", "catdesc"],
    "ecomm.date": ["dateid", "caldate", "day", "week", "month", "qtr", "year", "holiday"],
    "ems.event": ["eventid", "venueid", "catid", "dateid", "eventname", "starttime"],
    "ecomm.listing": [
        "listid", "sellerid", "eventid", "dateid", "numtickets", "priceperticket", "totalprice", "listtime",
    ],
    "ecomm.sales": [
        "salesid", "listid", "sellerid", "buyerid", "eventid", "dateid", "qtysold", "pricepaid", "commission",
        "saletime",
    ],
}
# Rows per table at scale 1.0: a few thousand in all, enough to exercise batching, quick to load.
BASE_ROWS: dict[str, int] = {
    "crm.users": 1000,
    "ems.venue": 50,
    "ems.category": 11,
    "ecomm.date": 365,
    "ems.event": 300,
    "ecomm.listing": 800,
    "ecomm.sales": 1200,
}

FIRST_DAY = dt.date(2023, 1, 1)
FIRST_DATEID = 1827  # TICKIT's first dateid; kept so ids look like the public sample's
SMALLINT_MAX = 32767
CENT = Decimal("0.01")
COMMISSION_RATE = Decimal("0.15")  # TICKIT's commission is 15% of the price paid
MAX_MONEY = Decimal("999999.99")  # decimal(8,2)
MAX_TICKETS_PER_SALE = 4

DAY_NAMES = ["MON", "TUE", "WED", "THU", "FRI", "SAT", "SUN"]  # fixed, not strftime: no locale dependence
HOLIDAYS = {(1, 1), (7, 4), (11, 11), (12, 25), (12, 31)}

CATEGORIES: list[tuple[str, str, str]] = [
    ("Sports", "MLB", "Major League Baseball"),
    ("Sports", "NHL", "National Hockey League"),
    ("Sports", "NFL", "National Football League"),
    ("Sports", "NBA", "National Basketball Association"),
    ("Sports", "MLS", "Major League Soccer"),
    ("Shows", "Musicals", "Musical theatre"),
    ("Shows", "Plays", "All non-musical theatre"),
    ("Shows", "Opera", "All opera and light opera"),
    ("Concerts", "Pop", "All rock and pop music concerts"),
    ("Concerts", "Jazz", "All jazz singers and bands"),
    ("Concerts", "Classical", "All symphony, concerto, and choir concerts"),
]
FIRST_NAMES = [
    "Rafael", "Vladimir", "Lars", "Barry", "Reagan", "Victor", "Tamekah", "Colton", "Mufutau", "Naida",
    "Blossom", "Kasimir", "Hedda", "Xerxes", "Chelsea", "Ifeoma", "Juniper", "Omar", "Priya", "Quentin",
    "Ursula", "Wendell", "Yara", "Zane", "Aiko", "Bjorn", "Carmen", "Dmitri", "Esme", "Farid",
]
LAST_NAMES = [
    "Taylor", "Humphrey", "Ratliff", "Roach", "Hess", "Juarez", "Ashley", "Richardson", "Dixon", "Bowen",
    "Gallegos", "Rowland", "Walsh", "Mccarty", "Shepard", "Okafor", "Lindqvist", "Nakamura", "Petrov", "Haddad",
    "Oconnor", "Silva", "Kowalski", "Moreau", "Iyer", "Schmidt", "Novak", "Fischer", "Garcia", "Lee",
]
CITIES: list[tuple[str, str]] = [
    ("New York", "NY"), ("Los Angeles", "CA"), ("Chicago", "IL"), ("Houston", "TX"), ("Phoenix", "AZ"),
    ("Philadelphia", "PA"), ("San Antonio", "TX"), ("San Diego", "CA"), ("Dallas", "TX"), ("Austin", "TX"),
    ("Seattle", "WA"), ("Denver", "CO"), ("Boston", "MA"), ("Nashville", "TN"), ("Portland", "OR"),
    ("Las Vegas", "NV"), ("Detroit", "MI"), ("Atlanta", "GA"), ("Miami", "FL"), ("Minneapolis", "MN"),
    ("Kansas City", "MO"), ("Salt Lake City", "UT"), ("Pittsburgh", "PA"), ("Baltimore", "MD"),
    ("Saint Louis", "MO"), ("New Orleans", "LA"), ("Cleveland", "OH"), ("Charlotte", "NC"),
]
EMAIL_DOMAINS = ["example.com", "example.org", "example.net", "mail.example", "inbox.example"]
VENUE_PREFIXES = [
    "Lincoln", "Riverside", "Grand", "Harbor", "Summit", "Liberty", "Pioneer", "Lakeside", "Union", "Capital",
    "Majestic", "Orpheum", "Paramount", "Memorial", "Heritage", "Cornerstone", "Bayview", "Northgate",
]
VENUE_KINDS = ["Arena", "Stadium", "Theatre", "Hall", "Center", "Amphitheatre", "Field", "Playhouse", "Coliseum"]
TEAMS = [
    "Hawks", "Bears", "Comets", "Pilots", "Rangers", "Lions", "Storm", "Mariners", "Giants", "Royals",
    "Falcons", "Wolves", "Titans", "Sharks", "Rockets", "Kings",
]
SHOWS = [
    "Wicked", "Mamma Mia!", "The Lion King", "Jersey Boys", "Hamlet", "Macbeth", "Our Town", "Cats", "Rent",
    "La Boheme", "Carmen", "Tosca", "The Magic Flute", "Chicago", "A Doll's House", "Death of a Salesman",
]
PERFORMERS = [
    "Linkin Park", "Norah Jones", "The Killers", "Diana Krall", "Yo-Yo Ma", "Coldplay", "Joshua Bell",
    "Herbie Hancock", "Florence and the Machine", "Wynton Marsalis", "Lang Lang", "The National",
    "Esperanza Spalding", "Arcade Fire", "Hilary Hahn", "Vampire Weekend",
]


# ---------------------------------------------------------------------------------------------------------------
# Pure helpers: generation from a Random, no I/O.


def _cents(cents: int) -> Decimal:
    """A money value with exactly two decimals from an integer number of cents."""
    return Decimal(cents).scaleb(-2)


def _money(value: Decimal) -> Decimal:
    """Round to cents; refuse values decimal(8,2) cannot hold instead of letting the INSERT fail later."""
    rounded = value.quantize(CENT, rounding=ROUND_HALF_UP)
    if not Decimal(0) <= rounded <= MAX_MONEY:
        raise ValueError(f"money value {rounded} outside decimal(8,2) range 0..{MAX_MONEY}")
    return rounded


def _at(day: dt.date, rng: random.Random, first_hour: int = 0, last_hour: int = 23) -> dt.datetime:
    """A timestamp on `day` with non-zero microseconds, so precision loss downstream is visible."""
    return dt.datetime.combine(
        day,
        dt.time(rng.randint(first_hour, last_hour), rng.randrange(60), rng.randrange(60), rng.randint(1, 999_999)),
    )


def _maybe(rng: random.Random, value: Any, null_rate: float) -> Any:
    """`value`, or None with probability `null_rate`."""
    return None if rng.random() < null_rate else value


def _sizes(scale: float) -> dict[str, int]:
    """Rows per table for `scale`, at least one each; rejects scales whose smallint ids would overflow."""
    if not scale > 0:
        raise ValueError(f"scale must be > 0, got {scale}")
    sizes = {table: max(1, round(base * scale)) for table, base in BASE_ROWS.items()}
    if FIRST_DATEID + sizes["ecomm.date"] - 1 > SMALLINT_MAX or sizes["ems.venue"] > SMALLINT_MAX:
        raise ValueError(f"scale {scale} too large: dateid/venueid are smallint")
    return sizes


def _week_of_year(day: dt.date) -> int:
    """Week number with weeks starting on Sunday and 1 January in week 1 (weeks never cross the year)."""
    jan1 = dt.date(day.year, 1, 1)
    sunday_offset = jan1.isoweekday() % 7  # days from the Sunday that starts week 1 to 1 January
    return (day.timetuple().tm_yday - 1 + sunday_offset) // 7 + 1


def _date_rows(n: int) -> list[Row]:
    """A calendar of `n` consecutive days from FIRST_DAY (one year at scale 1.0)."""
    rows: list[Row] = []
    for i in range(n):
        day = FIRST_DAY + dt.timedelta(days=i)
        rows.append((
            FIRST_DATEID + i, day, DAY_NAMES[day.weekday()], _week_of_year(day),
            calendar.month_abbr[day.month].upper(), str((day.month - 1) // 3 + 1), day.year,
            (day.month, day.day) in HOLIDAYS,
        ))
    return rows


def _user_row(rng: random.Random, userid: int) -> Row:
    first, last = rng.choice(FIRST_NAMES), rng.choice(LAST_NAMES)
    city, state = rng.choice(CITIES)
    username = "".join(rng.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789") for _ in range(8))
    email = f"{first}.{last}{userid}@{rng.choice(EMAIL_DOMAINS)}".lower()
    phone = f"({rng.randint(201, 989)}) {rng.randint(200, 999)}-{rng.randint(0, 9999):04d}"
    # TICKIT leaves many preference flags unknown: about a third are NULL.
    likes = [_maybe(rng, rng.random() < 0.5, 0.3) for _ in range(10)]
    return (userid, username, first, last, city, state, _maybe(rng, email, 0.03), _maybe(rng, phone, 0.02), *likes)


def _venue_name(rng: random.Random) -> str:
    return f"{rng.choice(VENUE_PREFIXES)} {rng.choice(VENUE_KINDS)}"


def _venue_row(rng: random.Random, venueid: int) -> Row:
    city, state = rng.choice(CITIES)
    seats = _maybe(rng, rng.randrange(500, 75_000, 100), 0.1)
    return (venueid, _venue_name(rng), city, state, seats)


def _category_rows(n: int) -> list[Row]:
    rows: list[Row] = []
    for i in range(n):
        catid = i + 1
        group, name, desc = CATEGORIES[i] if i < len(CATEGORIES) else ("Other", f"Misc{catid}", "Other events")
        rows.append((catid, group, name, desc))
    return rows


def _event_name(rng: random.Random, catgroup: str) -> str:
    if catgroup == "Sports":
        home, away = rng.sample(TEAMS, 2)
        return f"{home} vs {away}"
    if catgroup == "Shows":
        return rng.choice(SHOWS)
    return rng.choice(PERFORMERS)


def _event_row(rng: random.Random, eventid: int, venueids: Sequence[int], categories: Sequence[Row],
               dates: Sequence[Row]) -> Row:
    catid, catgroup, _, _ = rng.choice(categories)
    dateid, caldate = rng.choice(dates)[:2]
    return (eventid, rng.choice(venueids), catid, dateid, _event_name(rng, catgroup), _at(caldate, rng, 12, 21))


@dataclass(frozen=True)
class _Pools:
    """What generated listings and sales draw from: the calendar (dateid, caldate) and the user ids."""

    dates: Sequence[Row]
    userids: Sequence[int]
    date_index: dict[int, int] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "date_index", {row[0]: i for i, row in enumerate(self.dates)})


def _listing_row(rng: random.Random, listid: int, event: Row, pools: _Pools) -> Row:
    """A listing for `event` (eventid, dateid), listed up to 60 days before the event."""
    eventid, event_dateid = event
    last = pools.date_index[event_dateid]
    dateid, caldate = pools.dates[rng.randint(max(0, last - 60), last)][:2]
    numtickets = rng.randint(1, 30)
    price = _cents(rng.randint(20_00, 2_000_00))
    listtime = _maybe(rng, _at(caldate, rng, 0, 11), 0.02)  # morning listings; a few without a time
    return (listid, rng.choice(pools.userids), eventid, dateid, numtickets, price, _money(price * numtickets), listtime)


def _sale_row(rng: random.Random, salesid: int, listing: Row, *, remaining: int, event_dateid: int | None,
              pools: _Pools) -> Row:
    """A sale of at most `remaining` tickets of `listing`, between the listing date and the event date.

    An unknown event date (None, or a dateid not in the calendar) makes the sale fall on the listing date.
    """
    listid, sellerid, eventid, list_dateid, _, price, _, listtime = listing
    first = pools.date_index[list_dateid]
    last = first if event_dateid is None else max(first, pools.date_index.get(event_dateid, first))
    dateid, caldate = pools.dates[rng.randint(first, last)][:2]
    qty = rng.randint(1, min(MAX_TICKETS_PER_SALE, remaining))
    buyer = rng.choice(pools.userids)
    for _ in range(3):  # a seller rarely buys their own tickets; with a single user it has to
        if buyer != sellerid:
            break
        buyer = rng.choice(pools.userids)
    pricepaid = _money(price * qty)
    saletime = _at(caldate, rng, 12, 23)  # afternoon sales, so a same-day sale follows its morning listing
    if listtime is not None and saletime <= listtime:
        saletime = listtime + dt.timedelta(minutes=rng.randint(1, 59), microseconds=rng.randint(1, 999_999))
    return (salesid, listid, sellerid, buyer, eventid, dateid, qty, pricepaid,
            _money(pricepaid * COMMISSION_RATE), saletime)


def generate(scale: float = 1.0, seed: int = 7) -> dict[str, list[Row]]:
    """TICKIT-like rows for every table, consistent across tables, deterministic for (scale, seed).

    Args:
        scale: multiplies BASE_ROWS; every table gets at least one row.
        seed: seed of the one `random.Random` all values are drawn from.

    Returns:
        {"schema.table": rows}, each row a tuple in COLUMNS order.

    Raises:
        ValueError: scale is not positive, or so large that smallint ids overflow.
    """
    sizes = _sizes(scale)
    rng = random.Random(seed)
    dates = _date_rows(sizes["ecomm.date"])
    categories = _category_rows(sizes["ems.category"])
    users = [_user_row(rng, userid) for userid in range(1, sizes["crm.users"] + 1)]
    venues = [_venue_row(rng, venueid) for venueid in range(1, sizes["ems.venue"] + 1)]
    userids = [row[0] for row in users]
    venueids = [row[0] for row in venues]
    events = [_event_row(rng, eventid, venueids, categories, dates) for eventid in range(1, sizes["ems.event"] + 1)]
    event_dates = {row[0]: row[3] for row in events}
    pools = _Pools(dates, userids)
    listings = [
        _listing_row(rng, listid, (event[0], event[3]), pools)
        for listid, event in enumerate((rng.choice(events) for _ in range(sizes["ecomm.listing"])), start=1)
    ]
    # Sales never sell more tickets than a listing offers: draw only from listings with tickets left.
    remaining = {row[0]: row[4] for row in listings}
    open_listings = list(listings)
    sales: list[Row] = []
    for salesid in range(1, sizes["ecomm.sales"] + 1):
        if not open_listings:
            log.warning("all listings sold out after %d sales", len(sales))
            break
        i = rng.randrange(len(open_listings))
        listing = open_listings[i]
        sale = _sale_row(rng, salesid, listing, remaining=remaining[listing[0]],
                         event_dateid=event_dates[listing[2]], pools=pools)
        sales.append(sale)
        remaining[listing[0]] -= sale[6]
        if remaining[listing[0]] == 0:
            open_listings[i] = open_listings[-1]
            open_listings.pop()
    return {
        "crm.users": users,
        "ems.venue": venues,
        "ems.category": categories,
        "ecomm.date": dates,
        "ems.event": events,
        "ecomm.listing": listings,
        "ecomm.sales": sales,
    }


# ---------------------------------------------------------------------------------------------------------------
# Database I/O.


class Db:
    """One source database holding some of TICKIT's systems: PostgreSQL (psycopg; a system is a schema) or
    MariaDB (PyMySQL; a system is a database of the server). Queries take `%s` placeholders, as both drivers do.

    `names` renames systems in this database (e.g. {"ecomm": "ecomm_t1"}), so that several copies can live on one
    MariaDB server, whose databases are what PostgreSQL's schemas are inside one database.
    """

    def __init__(self, conn: Any, names: dict[str, str] | None = None) -> None:
        self.conn = conn
        self.kind = "postgresql" if isinstance(conn, psycopg.Connection) else "mariadb"
        self.names = dict(names or {})

    def schema(self, system: str) -> str:
        """The schema (PostgreSQL) or database (MariaDB) that holds a TICKIT system here."""
        return self.names.get(system, system)

    def quote(self, name: str) -> str:
        q = '"' if self.kind == "postgresql" else "`"
        return q + name.replace(q, q + q) + q

    def table(self, table: str) -> str:
        """`system.table` as this database names it, quoted."""
        system, name = table.split(".")
        return f"{self.quote(self.schema(system))}.{self.quote(name)}"

    def rows(self, query: str, params: Sequence[Any] | None = None) -> list[Row]:
        with self.conn.cursor() as cur:
            cur.execute(query, params)
            return [tuple(r) for r in cur.fetchall()] if cur.description else []

    def execute(self, query: str) -> None:
        with self.conn.cursor() as cur:
            cur.execute(query)

    def executemany(self, query: str, rows: Sequence[Row]) -> int:
        """Run `query` once per row; the number of rows it affected (MariaDB: changed, not only matched)."""
        with self.conn.cursor() as cur:
            cur.executemany(query, rows)
            return int(cur.rowcount)

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """One transaction (a savepoint inside a PostgreSQL caller's transaction)."""
        if self.kind == "postgresql":
            with self.conn.transaction():
                yield
            return
        self.conn.begin()
        try:
            yield
        except BaseException:
            self.conn.rollback()
            raise
        self.conn.commit()


class Placement:
    """Where each TICKIT system lives: a `Db` per system (crm, ems, ecomm).

    A psycopg connection given to this module's functions means all three systems in that PostgreSQL database;
    `Placement.reference(pg, mariadb)` is the reference setup's split: crm and ems on PostgreSQL, ecomm on
    MariaDB (the reference puts ems on SQL Server, which does not run here).
    """

    def __init__(self, systems: dict[str, Db]) -> None:
        missing = set(SCHEMAS) - set(systems)
        if missing:
            raise ValueError(f"no database for TICKIT systems {sorted(missing)}")
        self.systems = systems

    @classmethod
    def reference(cls, pg: Conn, mariadb: Any, mariadb_names: dict[str, str] | None = None) -> Placement:
        pg_db, maria_db = Db(pg), Db(mariadb, mariadb_names)
        return cls({"crm": pg_db, "ems": pg_db, "ecomm": maria_db})

    def db(self, table: str) -> Db:
        """The database of `system.table` (or of a system)."""
        return self.systems[table.split(".", maxsplit=1)[0]]

    def databases(self) -> list[tuple[Db, list[str]]]:
        """Each distinct database with the systems it holds, in SCHEMAS order."""
        found: list[tuple[Db, list[str]]] = []
        for system in SCHEMAS:
            db = self.systems[system]
            for seen, systems in found:
                if seen is db:
                    systems.append(system)
                    break
            else:
                found.append((db, [system]))
        return found


Target = Conn | Placement


def _placement(target: Target) -> Placement:
    if isinstance(target, Placement):
        return target
    db = Db(target)
    return Placement(dict.fromkeys(SCHEMAS, db))


def _insert_sql(db: Db, table: str) -> str:
    cols = COLUMNS[table]
    return (f"INSERT INTO {db.table(table)} ({', '.join(map(db.quote, cols))}) "
            f"VALUES ({', '.join(['%s'] * len(cols))})")


def _ddl(db: Db, systems: Sequence[str]) -> list[str]:
    """The schema file's statements for `systems`, with this database's names (each statement names one system)."""
    path = SCHEMA_FILE if db.kind == "postgresql" else MARIADB_SCHEMA_FILE
    text = "\n".join(line for line in path.read_text(encoding="utf-8").splitlines()
                     if not line.lstrip().startswith("--"))
    statements: list[str] = []
    for statement in (s.strip() for s in text.split(";")):
        match = re.search(r"\b(ecomm|ems|crm)\b", statement)
        if statement and match and match.group(1) in systems:
            renamed = re.sub(r"\b(ecomm|ems|crm)\b(?=\.|\s*$)", lambda m: db.quote(db.schema(m.group(1))), statement)
            statements.append(renamed)
    return statements


def create_schema(target: Target) -> None:
    """Create the TICKIT schemas and tables (schemas/tickit.sql, or schemas/tickit-mariadb.sql on MariaDB);
    idempotent.

    Args:
        target: a PostgreSQL connection (all systems there), or a Placement.
    """
    for db, systems in _placement(target).databases():
        with db.transaction():  # MariaDB commits DDL implicitly; PostgreSQL's is transactional
            for statement in _ddl(db, systems):
                db.execute(statement)
        log.info("created TICKIT %s in %s", ", ".join(systems), db.kind)


def counts(target: Target) -> dict[str, int]:
    """Row count of each TICKIT table.

    Returns:
        {"schema.table": rows} in TABLES order.
    """
    placement = _placement(target)
    result: dict[str, int] = {}
    for table in TABLES:
        db = placement.db(table)
        result[table] = int(db.rows(f"SELECT count(*) FROM {db.table(table)}")[0][0])
    return result


def _missing_tables(placement: Placement) -> list[str]:
    missing = []
    for table in TABLES:
        db = placement.db(table)
        system, name = table.split(".")
        found = db.rows("SELECT 1 FROM information_schema.tables WHERE table_schema = %s AND table_name = %s",
                        (db.schema(system), name))
        if not found:
            missing.append(table)
    return missing


def load(target: Target, scale: float = 1.0, seed: int = 7) -> dict[str, int]:
    """Generate TICKIT rows and insert them into the (empty) tables, one transaction per database (PostgreSQL
    by COPY).

    Args:
        target: a PostgreSQL connection where `create_schema` has run (all systems there), or a Placement.
        scale: multiplies BASE_ROWS (a few thousand rows in all at 1.0); each table gets at least one row.
        seed: seed of the generator; the same seed gives the same rows.

    Returns:
        {"schema.table": rows inserted}.

    Raises:
        ValueError: a table is missing or not empty, or `scale` is out of range.
    """
    placement = _placement(target)
    missing = _missing_tables(placement)
    if missing:
        raise ValueError(f"TICKIT tables missing: {', '.join(missing)}; run create first")
    non_empty = {t: n for t, n in counts(placement).items() if n}
    if non_empty:
        raise ValueError(f"TICKIT tables not empty: {non_empty}; load only fills empty tables (drop, create first)")
    started = time.monotonic()
    data = generate(scale, seed)
    inserted: dict[str, int] = {}
    for db, systems in placement.databases():
        tables = [t for t in TABLES if t.split(".")[0] in systems]
        with db.transaction():
            for table in tables:
                if db.kind == "postgresql":
                    copy_sql = sql.SQL("COPY {} ({}) FROM STDIN").format(
                        sql.SQL(db.table(table)), sql.SQL(", ").join(map(sql.Identifier, COLUMNS[table])))
                    with db.conn.cursor() as cur, cur.copy(copy_sql) as copy:
                        for row in data[table]:
                            copy.write_row(row)
                else:
                    db.executemany(_insert_sql(db, table), data[table])
                inserted[table] = len(data[table])
    log.info("loaded %d TICKIT rows (scale %s, seed %d) in %.2fs", sum(inserted.values()), scale, seed,
             time.monotonic() - started)
    return {t: inserted[t] for t in TABLES}


def drop(target: Target) -> None:
    """Drop the ecomm, ems and crm schemas (MariaDB: databases) with everything in them."""
    for db, systems in _placement(target).databases():
        with db.transaction():
            if db.kind == "postgresql":
                db.execute(f"DROP SCHEMA IF EXISTS {', '.join(db.quote(db.schema(s)) for s in systems)} CASCADE")
            else:
                for system in systems:
                    db.execute(f"DROP DATABASE IF EXISTS {db.quote(db.schema(system))}")
        log.info("dropped %s in %s", ", ".join(systems), db.kind)


def _max_id(db: Db, table: str) -> int:
    key = PRIMARY_KEYS[table][0]
    return int(db.rows(f"SELECT coalesce(max({db.quote(key)}), 0) FROM {db.table(table)}")[0][0])


def _pick(rng: random.Random, candidates: Sequence[Any], k: int, exclude: set[Any]) -> list[Any]:
    """Up to `k` distinct candidates not in `exclude`, in a seed-determined order."""
    pool = [c for c in candidates if c not in exclude]
    return rng.sample(pool, min(k, len(pool)))


def burst_records(changes: dict[str, dict[str, int]]) -> dict[str, int]:
    """The records a burst (`burst`'s result) adds to each table's topic when the connector flattens events with
    the unwrap SMT in rewrite mode: an insert, update or delete one record (no tombstone), a primary-key change two
    (a delete of the old key and a create of the new one)."""
    return {t: c["insert"] + c["update"] + c["delete"] + 2 * c["rekey"] for t, c in changes.items()}


def burst(target: Target, seed: int = 11, n: int = 100) -> dict[str, dict[str, int]]:
    """A burst of about `n` row changes over six tables, in one transaction per database.

    Inserts get ids above each table's current maximum; updates change prices, names, seats, start times and set
    some phones to NULL; one listing's price is updated three times. Deletes go sales first, then listings
    without sales, then users with no listings or sales, so nothing left refers to a deleted row. Last, a few
    listings without sales and idle users change primary key ("rekey": the row moves to a new id). Rows
    inserted or updated by the burst are not deleted by it, so every change survives in the final state.

    Args:
        target: a loaded TICKIT database (PostgreSQL connection), or a Placement.
        seed: seed of the generator; the same seed on the same database state gives the same changes.
        n: approximate number of row changes; each kind gets at least one (a delete only if a row qualifies).

    Returns:
        {"schema.table": {"insert": a, "update": b, "delete": c, "rekey": d}} for every table, counting affected
        rows. In Kafka each insert or update is one record, a delete two (event and tombstone), a rekey three.

    Raises:
        ValueError: n < 1, or a table other than sales is empty (load first).
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    started = time.monotonic()
    placement = _placement(target)
    with ExitStack() as transactions:
        for db, _ in placement.databases():
            transactions.enter_context(db.transaction())
        empty = [t for t, c in counts(placement).items() if c == 0 and t != "ecomm.sales"]
        if empty:
            raise ValueError(f"TICKIT tables empty: {', '.join(empty)}; load first")
        # The steps draw from one generator in this order: the same seed gives the same changes.
        b = _Burst(placement, random.Random(seed), n)
        b.inserts()
        b.updates()
        b.deletes()
        b.rekeys()
    log.info("burst (seed %d, n %d) in %.2fs: %s", seed, n, time.monotonic() - started,
             {t: c for t, c in b.result.items() if any(c.values())})
    return b.result


class _Burst:
    """One burst's state inside its transactions: the rows read at the start, what it has touched, the counts."""

    def __init__(self, placement: Placement, rng: random.Random, n: int) -> None:
        self.placement, self.rng, self.n = placement, rng, n
        self.result = {table: {"insert": 0, "update": 0, "delete": 0, "rekey": 0} for table in TABLES}
        self.touched: dict[str, set[int]] = {table: set() for table in TABLES}
        t, fetch = self.t, self.fetch
        self.max_ids = {table: _max_id(placement.db(table), table) for table in TABLES}
        self.dates = fetch("ecomm.date", f"SELECT dateid, caldate FROM {t('ecomm.date')} ORDER BY dateid")
        self.categories = fetch("ems.category",
                                f"SELECT catid, catgroup, catname, catdesc FROM {t('ems.category')} ORDER BY catid")
        self.users = fetch("crm.users", f"SELECT userid, lastname, email FROM {t('crm.users')} ORDER BY userid")
        self.venues = fetch("ems.venue",
                            f"SELECT venueid, venuename, venueseats FROM {t('ems.venue')} ORDER BY venueid")
        self.events = fetch("ems.event", f"SELECT eventid, dateid, starttime FROM {t('ems.event')} ORDER BY eventid")
        self.listings = [(*row[:8], int(row[8])) for row in fetch("ecomm.listing", f"""
            SELECT l.listid, l.sellerid, l.eventid, l.dateid, l.numtickets, l.priceperticket, l.totalprice,
                   l.listtime, l.numtickets - coalesce(sum(s.qtysold), 0) AS remaining
            FROM {t('ecomm.listing')} l LEFT JOIN {t('ecomm.sales')} s ON s.listid = l.listid
            WHERE l.priceperticket IS NOT NULL
            GROUP BY l.listid ORDER BY l.listid""")]
        self.sales = fetch("ecomm.sales", f"SELECT salesid, pricepaid FROM {t('ecomm.sales')} ORDER BY salesid")
        self.unsold: list[int] = []
        self.idle: list[int] = []
        self.gone_listings: list[int] = []
        self.gone_users: list[int] = []

    def k(self, fraction: float) -> int:
        return max(1, round(self.n * fraction))

    def t(self, table: str) -> str:
        return self.placement.db(table).table(table)

    def fetch(self, table: str, query: str) -> list[Row]:
        return self.placement.db(table).rows(query)

    def run(self, table: str, op: str, query: str, rows: Sequence[Row]) -> None:
        if not rows:
            return
        self.result[table][op] += self.placement.db(table).executemany(query, rows)
        if op != "delete":
            self.touched[table].update(row[0] if op == "insert" else row[-1] for row in rows)

    def insert(self, table: str, rows: Sequence[Row]) -> None:
        self.run(table, "insert", _insert_sql(self.placement.db(table), table), rows)

    def inserts(self) -> None:
        """Dimensions first: new users and venues, events at existing venues, listings, then sales."""
        rng, k, max_ids = self.rng, self.k, self.max_ids
        new_users = [_user_row(rng, max_ids["crm.users"] + i) for i in range(1, k(0.08) + 1)]
        self.insert("crm.users", new_users)
        new_venues = [_venue_row(rng, max_ids["ems.venue"] + i) for i in range(1, k(0.02) + 1)]
        self.insert("ems.venue", new_venues)
        userids = [row[0] for row in self.users] + [row[0] for row in new_users]
        venueids = [row[0] for row in self.venues] + [row[0] for row in new_venues]
        new_events = [_event_row(rng, max_ids["ems.event"] + i, venueids, self.categories, self.dates)
                      for i in range(1, k(0.05) + 1)]
        self.insert("ems.event", new_events)
        event_dates: dict[int, int] = {row[0]: row[1] for row in self.events} | {row[0]: row[3] for row in new_events}
        event_keys = list(event_dates.items())
        pools = _Pools(self.dates, userids)
        new_listings = [
            _listing_row(rng, max_ids["ecomm.listing"] + i, rng.choice(event_keys), pools)
            for i in range(1, k(0.12) + 1)
        ]
        self.insert("ecomm.listing", new_listings)
        open_listings = [(row[:8], row[8]) for row in self.listings if row[8] > 0]
        open_listings += [(row, row[4]) for row in new_listings if row[5] is not None]
        self.insert("ecomm.sales", self._new_sales(open_listings, event_dates, pools))

    def _new_sales(
        self, open_listings: list[tuple[Row, int]], event_dates: dict[int, int], pools: _Pools
    ) -> list[Row]:
        rng = self.rng
        new_sales: list[Row] = []
        for i in range(1, self.k(0.20) + 1):
            if not open_listings:
                break
            j = rng.randrange(len(open_listings))
            listing, left = open_listings[j]
            sale = _sale_row(rng, self.max_ids["ecomm.sales"] + i, listing, remaining=left,
                             event_dateid=event_dates.get(listing[2]), pools=pools)
            new_sales.append(sale)
            open_listings[j] = (listing, left - sale[6])
            if left - sale[6] == 0:
                open_listings[j] = open_listings[-1]
                open_listings.pop()
        return new_sales

    def updates(self) -> None:
        """Updates of rows that existed before the burst."""
        rng, k, t, touched = self.rng, self.k, self.t, self.touched
        old_users = [row for row in self.users if row[0] not in touched["crm.users"]]
        moved = rng.sample(old_users, min(k(0.08), len(old_users)))
        user_updates: list[Row] = []
        for userid, lastname, _ in moved:
            new_last = rng.choice([name for name in LAST_NAMES if name != lastname])
            city, state = rng.choice(CITIES)
            email = f"{new_last.lower()}{userid}@{rng.choice(EMAIL_DOMAINS)}"
            user_updates.append((new_last, city, state, email, userid))
        self.run("crm.users", "update",
                 f"UPDATE {t('crm.users')} SET lastname = %s, city = %s, state = %s, email = %s WHERE userid = %s",
                 user_updates)
        no_phone = _pick(rng, [row[0] for row in self.users], k(0.03), touched["crm.users"])
        self.run("crm.users", "update", f"UPDATE {t('crm.users')} SET phone = NULL WHERE userid = %s",
                 [(u,) for u in no_phone])

        venue_updates = [
            (_venue_name(rng), rng.randrange(500, 75_000, 100), v)
            for v in _pick(rng, [row[0] for row in self.venues], k(0.03), touched["ems.venue"])
        ]
        self.run("ems.venue", "update",
                 f"UPDATE {t('ems.venue')} SET venuename = %s, venueseats = %s WHERE venueid = %s", venue_updates)
        catid, _, catname, catdesc = rng.choice(self.categories)
        self.run("ems.category", "update", f"UPDATE {t('ems.category')} SET catdesc = %s WHERE catid = %s",
                 [(f"{catdesc or catname} (revised)"[:50], catid)])

        # Rescheduled events: start time moves by a few hours on the same day, keeping non-zero microseconds.
        event_updates = [
            (starttime + dt.timedelta(hours=rng.choice([-2, -1, 1, 2]), microseconds=rng.randint(1, 999)), eventid)
            for eventid, _, starttime in _pick(rng, [e for e in self.events if e[2] is not None], k(0.05), set())
        ]
        self.run("ems.event", "update", f"UPDATE {t('ems.event')} SET starttime = %s WHERE eventid = %s",
                 event_updates)
        self._listing_and_sale_updates()

    def _listing_and_sale_updates(self) -> None:
        rng, k, t = self.rng, self.k, self.t
        old_listings = [row for row in self.listings if row[0] not in self.touched["ecomm.listing"]]
        repriced = rng.sample(old_listings, min(k(0.08) + 1, len(old_listings)))
        price_sql = f"UPDATE {t('ecomm.listing')} SET priceperticket = %s, totalprice = %s WHERE listid = %s"
        listing_updates: list[Row] = []
        for row in repriced[1:]:
            price = _money(row[5] * Decimal(rng.randint(80, 120)) / 100)
            listing_updates.append((price, _money(price * row[4]), row[0]))
        self.run("ecomm.listing", "update", price_sql, listing_updates)
        if repriced:
            # One row changed three times in the transaction: a consumer that keeps only the latest change per key
            # must end with the last price, not the first or an intermediate one.
            listid, numtickets, price = repriced[0][0], repriced[0][4], repriced[0][5]
            for factor in ("1.10", "0.90", "1.05"):
                price = _money(price * Decimal(factor))
                self.run("ecomm.listing", "update", price_sql, [(price, _money(price * numtickets), listid)])

        sale_updates = [
            (_money(paid * Decimal("0.9")), _money(_money(paid * Decimal("0.9")) * COMMISSION_RATE), salesid)
            for salesid, paid in _pick(rng, [s for s in self.sales if s[1] is not None], k(0.05), set())
        ]
        self.run("ecomm.sales", "update",
                 f"UPDATE {t('ecomm.sales')} SET pricepaid = %s, commission = %s WHERE salesid = %s", sale_updates)

    def deletes(self) -> None:
        """Children first: sales, then listings left without sales, then users with no listings or sales (looked up
        per table: the systems may live in different databases)."""
        rng, k, t, fetch, touched, max_ids = self.rng, self.k, self.t, self.fetch, self.touched, self.max_ids
        gone_sales = _pick(rng, [row[0] for row in self.sales], k(0.10), touched["ecomm.sales"])
        self.run("ecomm.sales", "delete", f"DELETE FROM {t('ecomm.sales')} WHERE salesid = %s",
                 [(s,) for s in gone_sales])
        self.unsold = [row[0] for row in fetch("ecomm.listing", f"""
            SELECT l.listid FROM {t('ecomm.listing')} l
            WHERE NOT EXISTS (SELECT 1 FROM {t('ecomm.sales')} s WHERE s.listid = l.listid) ORDER BY l.listid""")]
        self.gone_listings = _pick(rng, [x for x in self.unsold if x <= max_ids["ecomm.listing"]], k(0.05),
                                   touched["ecomm.listing"])
        self.run("ecomm.listing", "delete", f"DELETE FROM {t('ecomm.listing')} WHERE listid = %s",
                 [(x,) for x in self.gone_listings])
        busy = {row[0] for row in fetch("ecomm.listing", f"SELECT sellerid FROM {t('ecomm.listing')}")}
        busy |= {u for row in fetch("ecomm.sales", f"SELECT sellerid, buyerid FROM {t('ecomm.sales')}") for u in row}
        self.idle = [row[0] for row in fetch("crm.users", f"SELECT userid FROM {t('crm.users')} ORDER BY userid")
                     if row[0] not in busy]
        self.gone_users = _pick(rng, [u for u in self.idle if u <= max_ids["crm.users"]], k(0.04),
                                touched["crm.users"])
        self.run("crm.users", "delete", f"DELETE FROM {t('crm.users')} WHERE userid = %s",
                 [(u,) for u in self.gone_users])

    def rekeys(self) -> None:
        """Primary-key changes of rows nothing refers to: listings without sales and idle users get new ids above
        every insert's (Debezium sends a delete of the old key, its tombstone, and a create of the new one)."""
        touched, max_ids = self.touched, self.max_ids
        next_ids = {table: max(max_ids[table], *touched[table]) if touched[table] else max_ids[table]
                    for table in ("ecomm.listing", "crm.users")}
        for table, key, candidates, gone in (("ecomm.listing", "listid", self.unsold, self.gone_listings),
                                             ("crm.users", "userid", self.idle, self.gone_users)):
            for old in _pick(self.rng, [x for x in candidates if x <= max_ids[table] and x not in gone],
                             self.k(0.02), touched[table]):
                next_ids[table] += 1
                self.run(table, "rekey", f"UPDATE {self.t(table)} SET {key} = %s WHERE {key} = %s",
                         [(next_ids[table], old)])
                touched[table].add(next_ids[table])


# ---------------------------------------------------------------------------------------------------------------
# CLI.


def _default_dsn() -> str:
    """DEFAULT_DSN, with the password from PGPASSWORD when that is set."""
    password = os.environ.get("PGPASSWORD")
    return make_conninfo(DEFAULT_DSN, password=password) if password else DEFAULT_DSN


def _parser() -> argparse.ArgumentParser:
    dsn_help = f"libpq connection string (default: {DEFAULT_DSN!r}, password from PGPASSWORD when set)"
    parser = argparse.ArgumentParser(
        prog="tickit.py", description="TICKIT sample data in the CDC source database. Prints JSON on stdout.")
    parser.add_argument("--dsn", default=None, help=dsn_help)
    # Also accepted after the subcommand; SUPPRESS keeps the subcommand's default from hiding a --dsn given before.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--dsn", default=argparse.SUPPRESS, help=dsn_help)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    sub.add_parser("create", parents=[common], help="create schemas ecomm, ems, crm and their tables (idempotent)")
    p_load = sub.add_parser("load", parents=[common], help="fill the empty tables with generated rows")
    p_load.add_argument("--scale", type=float, default=1.0, help="row-count multiplier (default: 1.0)")
    p_load.add_argument("--seed", type=int, default=7, help="generator seed (default: 7)")
    p_burst = sub.add_parser("burst", parents=[common], help="one transaction of inserts, updates and deletes")
    p_burst.add_argument("--n", type=int, default=100, help="approximate number of row changes (default: 100)")
    p_burst.add_argument("--seed", type=int, default=11, help="generator seed (default: 11)")
    sub.add_parser("counts", parents=[common], help="row count per table")
    sub.add_parser("drop", parents=[common], help="drop schemas ecomm, ems, crm cascade")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one subcommand and print its result as JSON.

    Returns:
        Process exit code: 0 on success, 2 when the command is refused (ValueError).
    """
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(message)s")
    result: object
    with psycopg.connect(args.dsn or _default_dsn(), autocommit=True) as conn:
        try:
            if args.command == "create":
                create_schema(conn)
                result = {"created": TABLES}
            elif args.command == "load":
                result = load(conn, scale=args.scale, seed=args.seed)
            elif args.command == "burst":
                result = burst(conn, seed=args.seed, n=args.n)
            elif args.command == "counts":
                result = counts(conn)
            else:
                drop(conn)
                result = {"dropped": SCHEMAS}
        except ValueError as e:
            log.error("%s refused: %s", args.command, e)
            return 2
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
