"""Entry point: `spark-submit app/main.py --conf conf/prod.yaml [--available-now]`.

The packaged job runs the same file: `spark-submit --py-files cdc_lakehouse.zip main.py --conf s3://.../prod.yaml`
(scripts/package.sh), from any working directory; `--conf` takes a local path or an s3:// / s3a:// URI.

Reads Debezium change events from Kafka, writes every record to Bronze and the latest row per key to the
Hudi Silver tables, one foreachBatch call per micro-batch.
"""
from __future__ import annotations

# ruff: noqa: E402 - every other import follows the sys.path repair below
import os
import sys

# spark-submit app/main.py runs this file as a script, and Python puts app/ (not the repository) first on sys.path.
# There a module of app/ would stand in for a standard library module of its name for every later import (an
# app/types.py once broke argparse -> enum -> types on Debian's Python), so app/ leaves sys.path before anything
# else is imported, and the repository, which the package imports need, takes its place. The packaged
# copy of this file sits outside the package (app/ comes from the zip on --py-files): nothing to change, and adding
# its parent could put a stray checkout's app/ ahead of the zip.
_HERE = os.path.dirname(os.path.abspath(__file__))
if os.path.exists(os.path.join(_HERE, "__init__.py")):
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
    sys.path.insert(0, os.path.dirname(_HERE))

import argparse
import logging

from app.config import load_config
from app.errors import ConfigError, PipelineError
from app.hooks import Hooks
from app.job import run
from app.routing.route import check_routes, configured_topics

log = logging.getLogger("app.main")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    # No abbreviations: scripts/submit.sh tells a stream from an --available-now run by the flag's full name.
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     allow_abbrev=False)
    parser.add_argument(
        "--conf", required=True, help="YAML job config: a path (conf/local.yaml) or an s3:// or s3a:// URI"
    )
    parser.add_argument(
        "--check-config",
        action="store_true",
        help="validate the config (keys, types, allowed values, secrets' variables set) and exit: 0 if valid, 2 if "
        "not; reads no data and starts no Spark",
    )
    parser.add_argument(
        "--available-now",
        action="store_true",
        help="process every offset present at start (Hudi commits and checkpoint included), then exit 0",
    )
    parser.add_argument(
        "--from-starting-offsets",
        action="store_true",
        help="without a checkpoint, read from kafka.starting_offsets even though Silver tables exist (by default the "
        "job resumes after the offsets they committed, or refuses to start when they record none)",
    )
    return parser.parse_args(argv)


def configure_logging(level: str) -> None:
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    logging.getLogger("py4j").setLevel(logging.WARNING)


def main(argv: list[str] | None = None, hooks: Hooks | None = None) -> int:
    """The command line; `hooks` are tools' seams into each batch (app/hooks.py), never set by the shipped job."""
    args = parse_args(argv)
    try:
        config = load_config(args.conf)
    except ConfigError as e:
        print(f"invalid config {args.conf}: {e}", file=sys.stderr)
        return 2
    if args.check_config:
        try:  # the routes the config itself names; those of other topics are checked at start
            check_routes(config, configured_topics(config))
        except ConfigError as e:
            print(f"invalid config {args.conf}: {e}", file=sys.stderr)
            return 2
        sources = ", ".join(s.label for s in config.source_list)
        print(f"config {args.conf} is valid: sources {sources}; topics matching {config.kafka.topic_pattern}; "
              f"Silver in {config.lake.silver_path} (databases {', '.join(config.databases)})")
        return 0
    configure_logging(config.log_level)
    try:
        run(config, args.conf, available_now=args.available_now, from_starting_offsets=args.from_starting_offsets,
            hooks=hooks)
    except ConfigError as e:  # known only once the topics are (two topics mapping to one table, say)
        log.error("invalid config %s: %s", args.conf, e)
        return 2
    except PipelineError as e:
        log.error("%s: %s", type(e).__name__, e)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
