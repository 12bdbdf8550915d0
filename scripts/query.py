#!/usr/bin/env python3
"""Query the lake with Spark SQL, through the same session settings as the job (its jars, Hudi, the metastore).

    .venv/bin/python scripts/query.py -e "show tables in tickit"
    .venv/bin/python scripts/query.py -e "select * from tickit.crm_users limit 5"
    .venv/bin/python scripts/query.py                       # a prompt: SQL ending in ';', empty line or 'exit' ends

Tables are the catalog's (`<lake.database>.<table>`); Hudi's own SQL works too (this session has Hudi's SQL
extension, which the job's goes without: app/spark.py `HUDI_SQL_CONF`), e.g. time travel with
`select * from hudi_table_changes(...)` or `select ... timestamp as of '<instant>'`. The metastore's password comes
from its environment variable (`metastore.password_env`), as for the job; with the local stack, scripts/stack.sh up
first. Nothing is written.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from app.config import load_config  # noqa: E402 - after the path above, for a run as a script
from app.errors import ConfigError  # noqa: E402
from app.spark import build_session  # noqa: E402

LOCAL_LOGINS = {"METASTORE_PASSWORD": "postgres", "AWS_ACCESS_KEY_ID": "local", "AWS_SECRET_ACCESS_KEY": "local"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--conf", default=str(ROOT / "conf" / "local.yaml"), help="job config (default: local)")
    parser.add_argument("-e", "--execute", action="append", default=[], help="a statement to run (repeatable)")
    parser.add_argument("--rows", type=int, default=20, help="rows shown per result (default 20)")
    args = parser.parse_args(argv)

    if args.conf.endswith("conf/local.yaml"):  # the local stack's logins, unless set
        os.environ.update({**LOCAL_LOGINS, **os.environ})
    try:
        config = load_config(args.conf)
    except ConfigError as e:
        print(f"invalid config {args.conf}: {e}", file=sys.stderr)
        return 2
    spark = build_session("cdc-query", config.spark, config.metastore, hudi_sql=True)
    spark.sparkContext.setLogLevel("ERROR")
    statements = list(args.execute)
    interactive = not statements
    while True:
        if interactive:
            statement = _read_statement()
            if statement is None:
                break
            statements = [statement]
        for statement in statements:
            try:
                spark.sql(statement).show(args.rows, truncate=False)
            except Exception as e:  # an SQL error: shown, the prompt goes on (-e: exit 1)
                print(f"error: {str(e).strip().splitlines()[0]}", file=sys.stderr)
                if not interactive:
                    return 1
        if not interactive:
            break
    spark.stop()
    return 0


def _read_statement() -> str | None:
    """One statement from the prompt, up to its ';'; None at the end of input, an empty line or `exit`."""
    lines: list[str] = []
    while True:
        try:
            line = input("sql> " if not lines else "...> ")
        except EOFError:
            return None
        if not lines and line.strip().lower() in ("", "exit", "quit"):
            return None
        lines.append(line)
        if line.rstrip().endswith(";"):
            return "\n".join(lines).rstrip().rstrip(";")


if __name__ == "__main__":
    sys.exit(main())
