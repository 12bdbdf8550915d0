#!/usr/bin/env python3
"""Capture golden wire vectors: the bytes the real Debezium connector and Apicurio 2.6 converter write per framing.

For each framing (headers, id8, id4) and id type (contentId, globalId), on the local stack (scripts/stack.sh up):
1. recreate the table `golden.orders` (composite key) in the source database and insert two rows;
2. register a Debezium PostgreSQL connector whose converters write that framing (app/connect.converter_config);
3. after its snapshot, insert, update and delete one row each;
4. read the topic's records (key, value, headers, as bytes) and fetch every schema they name from the registry;
5. write tests/golden/<framing>-<id type>.json.

tests/unit/test_golden.py decodes these files and compares them with the rows the steps above produce. Re-run
this script only when the connector or converter version changes; review the diff of the JSON files.

Usage: .venv/bin/python scripts/capture_golden.py [--out tests/golden] [--only headers-globalId ...]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import psycopg
import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from devkit.connect import converter_config  # noqa: E402
from tests.support.cdc import PG_DSN, REGISTRY_URL, KafkaRecord, debezium_connector, wait_for_records  # noqa: E402

MODES = [(framing, id_type) for framing in ("headers", "id8", "id4") for id_type in ("contentId", "globalId")]
SCHEMA = "golden"
SETUP_SQL = f"""
drop schema if exists {SCHEMA} cascade;
create schema {SCHEMA};
create table {SCHEMA}.orders (region text, id int, note text, qty int not null, primary key (region, id));
insert into {SCHEMA}.orders values ('eu', 1, 'first', 1), ('us', 2, 'second', 2);
"""
CHANGES_SQL = f"""
insert into {SCHEMA}.orders values ('eu', 3, 'third', 3);
update {SCHEMA}.orders set note = null, qty = 10 where region = 'eu' and id = 1;
delete from {SCHEMA}.orders where region = 'us' and id = 2;
"""
# Two snapshot reads, then create, update, delete and the delete's tombstone.
EXPECTED_RECORDS = 6
ID_HEADERS = {
    f"apicurio.{side}.{id_type}": id_type for side in ("key", "value") for id_type in ("globalId", "contentId")
}


def capture(framing: str, id_type: str) -> dict[str, object]:
    """Run the steps of the module docstring for one framing and return the golden document."""
    mode = f"{framing}-{id_type}"
    prefix = f"golden_{framing}_{id_type.lower()}"
    with psycopg.connect(PG_DSN, autocommit=True) as conn:
        conn.execute(SETUP_SQL)
    name = f"golden-{framing}-{id_type.lower()}"
    with debezium_connector(name, prefix, [SCHEMA], framing=framing, id_type=id_type):
        topic = f"{prefix}.{SCHEMA}.orders"
        wait_for_records(topic, 2, timeout_s=120)
        with psycopg.connect(PG_DSN, autocommit=True) as conn:
            conn.execute(CHANGES_SQL)
        records = wait_for_records(topic, EXPECTED_RECORDS, timeout_s=120)
    return {
        "mode": mode,
        "converter": {k: v for k, v in converter_config(REGISTRY_URL, framing, id_type).items() if "value." in k},
        "topic": topic,
        "records": [_record(r) for r in records],
        "schemas": _schemas(records, framing, id_type),
    }


def _record(r: KafkaRecord) -> dict[str, object]:
    return {
        "partition": r.partition,
        "offset": r.offset,
        "key": r.key.hex() if r.key is not None else None,
        "value": r.value.hex() if r.value is not None else None,
        "headers": [[name, value.hex()] for name, value in r.headers],
    }


def _schemas(records: list[KafkaRecord], framing: str, id_type: str) -> dict[str, str]:
    """Every schema the records name, keyed '<id type>:<id>', fetched from the registry's v3 API."""
    refs: set[tuple[str, int]] = set()
    for r in records:
        if framing == "headers":
            refs.update((ID_HEADERS[n], int.from_bytes(v, "big")) for n, v in r.headers if n in ID_HEADERS)
            continue
        width = 8 if framing == "id8" else 4
        for data in (r.key, r.value):
            if data is not None:
                refs.add((id_type, int.from_bytes(data[1 : 1 + width], "big")))
    out = {}
    for kind, schema_id in sorted(refs):
        url = f"{REGISTRY_URL}/apis/registry/v3/ids/{kind}s/{schema_id}"
        response = requests.get(url, timeout=10)
        response.raise_for_status()
        out[f"{kind}:{schema_id}"] = response.content.decode("utf-8")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=ROOT / "tests" / "golden", help="directory of the JSON files")
    parser.add_argument(
        "--only", nargs="*", default=None, metavar="MODE",
        help="capture only these modes, e.g. headers-globalId id4-contentId (default: all six)",
    )
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for framing, id_type in MODES:
        mode = f"{framing}-{id_type}"
        if args.only and mode not in args.only:
            continue
        started = time.monotonic()
        doc = capture(framing, id_type)
        path = args.out / f"{mode}.json"
        path.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
        print(f"{mode}: {len(doc['records'])} records, {len(doc['schemas'])} schemas -> {path} "  # type: ignore[arg-type]
              f"({time.monotonic() - started:.1f} s)")
    with psycopg.connect(PG_DSN, autocommit=True) as conn:
        conn.execute(f"drop schema if exists {SCHEMA} cascade")
    return 0


if __name__ == "__main__":
    sys.exit(main())
