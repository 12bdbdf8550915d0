#!/usr/bin/env python3
"""Print the streaming job's status: what each topic feeds, each Silver table's latest batch figures, the topics
skipped and why, quarantined tables, dead letters and diverged keys per table, Silver tables no topic feeds any
longer, and the last failure.

The job rewrites `<lake.checkpoint_path>/status.json` at start and after every batch (app/state/status.py); this
reads it (a local path, or S3 with boto3: credentials as usual, the endpoint from AWS_ENDPOINT_URL_S3 /
AWS_ENDPOINT_URL or else the config's `spark.hadoop.fs.s3a.endpoint`). No Spark is started.

    python scripts/status.py --conf conf/local.yaml          # a summary
    python scripts/status.py --conf conf/prod.yaml --json    # the document as the job wrote it

    python scripts/status.py --conf conf/prod.yaml --max-age 5m   # also 3 when the heartbeat is older than that

Exit status: 0, or 1 when the job recorded a failure (so a cron check can alert), 3 when `--max-age` is given and
the status's heartbeat (rewritten every `recovery.heartbeat_s`, 60 s by default, while the job lives, also when no
batch runs and during an outage) is older: the job died without a word (SIGKILL, out of memory, a lost node); 4 when
a source is stalled (its connector has delivered nothing for `recovery.source_stalled_after_s`); or 2 when there is
no status or config to read.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.config import load_config
from app.errors import ConfigError
from app.state.status import read_status, status_path

AGE_UNITS = {"s": 1, "m": 60, "h": 3600}
FIGURES = ("rows_in", "upserts", "deletes", "skipped", "superseded", "blocked", "unresolved", "replayed")


def summary(status: dict[str, Any], location: str) -> str:
    lines = [f"status {location}", f"  config {status['conf']}, started {status['started_at']}, "
                                    f"{status['batches']} batches since"]
    last = status.get("last_batch")
    if last:
        lines.append(f"  last batch {last['batch_id']} at {last['at']} ({last['duration_s']} s): "
                     f"{len(last['tables'])} tables, {len(last['skipped_topics'])} topics skipped")
    lines.append(f"  failure: {status['failure'] or 'none'}")
    lines.append(f"  heartbeat: {status.get('heartbeat_at') or 'none yet'}")
    lines.extend(_outage_and_sources(status))
    lines.append("tables (each at its latest batch):")
    for name, t in sorted(status["tables"].items()):
        figures = " ".join(f"{k}={t[k]}" for k in FIGURES)
        fed = f" topics={','.join(t['topics'])}" if t.get("topics") else ""
        lines.append(f"  {name}: batch {t['batch_id']} at {t['at']}{fed} {figures} duration_s={t['duration_s']:.2f}")
    lines.append("routes:")
    for topic, route in sorted(status["routes"].items()):
        lines.append(f"  {topic} -> {route['table']}" + (f" ({route['why']})" if route["why"] else ""))
    lines.append("skipped topics:" + ("" if status["skipped_topics"] else " none"))
    for topic, s in sorted(status["skipped_topics"].items()):
        seen = "none read yet" if s["batch_id"] is None else f"{s['records']} records in batch {s['batch_id']}"
        lines.append(f"  {topic}: {s['reason']} ({seen}; Bronze keeps them)")
    quarantined = status.get("quarantined") or {}
    lines.append("quarantined tables (their records go to the dead letters):" + ("" if quarantined else " none"))
    for name, q in sorted(quarantined.items()):
        lines.append(f"  {name}: since batch {q['batch_id']} at {q['at']}: {q['reason']}")
    dead = status.get("dead_letters") or {}
    lines.append("dead letters (since the status began):" + ("" if dead else " none"))
    for name, d in sorted(dead.items()):
        kinds = ", ".join(f"{k}={n}" for k, n in sorted(d["kinds"].items()))
        more = " (more not listed)" if d.get("diverged_keys_truncated") else ""
        lines.append(f"  {name}: {d['records']} records ({kinds}); diverged keys: {len(d['diverged_keys'])}{more}")
    unmatched = status.get("unmatched_settings") or {}
    lines.append("table settings naming no table yet:" + ("" if unmatched else " none"))
    for key, topic in sorted(unmatched.items()):
        lines.append(f"  {key}: no subscribed topic {topic}")
    lines.append("stale tables (fed by no subscribed topic):" + ("" if status["stale_tables"] else " none"))
    for name, reason in sorted(status["stale_tables"].items()):
        lines.append(f"  {name}: {reason}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--conf", required=True, help="the job's YAML config (a path or an s3:// URI)")
    parser.add_argument("--json", action="store_true", help="print the status document itself")
    parser.add_argument("--max-age", type=parse_age, metavar="AGE",
                        help="exit 3 when the heartbeat is older than AGE (e.g. 300s, 5m, 1h; a number is seconds)")
    args = parser.parse_args(argv)
    try:
        config = load_config(args.conf)
    except ConfigError as e:
        print(f"invalid config {args.conf}: {e}", file=sys.stderr)
        return 2
    location = status_path(config)
    endpoint = None
    if not (os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")):
        endpoint = config.spark.conf.get("spark.hadoop.fs.s3a.endpoint")
    try:
        status = read_status(location, endpoint)
    except FileNotFoundError:
        print(f"no status at {location}: the job has not started with this checkpoint", file=sys.stderr)
        return 2
    print(json.dumps(status, indent=2, sort_keys=True) if args.json else summary(status, location))
    if args.max_age is not None:
        age = heartbeat_age(status)
        if age is None or age > args.max_age:
            seen = "no heartbeat" if age is None else f"the heartbeat is {age:.0f} s old"
            print(f"STALE: {seen} (--max-age {args.max_age:g} s): the job is not running", file=sys.stderr)
            return 3
    stalled = sorted(label for label, s in (status.get("sources") or {}).items() if s["stalled"])
    if stalled:
        print(f"STALLED: source {', '.join(stalled)} delivers nothing (recovery.source_stalled_after_s)",
              file=sys.stderr)
        return 4
    return 1 if status.get("failure") else 0


def _outage_and_sources(status: dict[str, Any]) -> list[str]:
    lines = []
    outage = status.get("outage")
    if outage:
        lines.append(f"  OUTAGE: waiting for {outage['service']} since {outage['since']} (attempt {outage['attempt']}, "
                     f"next at {outage['next_attempt_at']}): {outage['error']}")
    for label, source in sorted((status.get("sources") or {}).items()):
        seen = source["delivered_at"] or "nothing since the job started"
        lines.append(f"  source {label}: {'STALLED, ' if source['stalled'] else ''}last delivered {seen} "
                     f"({source['age_s']:.0f} s before the heartbeat)")
    return lines


def parse_age(text: str) -> float:
    """`300`, `300s`, `5m`, `1h` -> seconds."""
    text = text.strip()
    unit = AGE_UNITS.get(text[-1:], None)
    try:
        return float(text[:-1] if unit else text) * (unit or 1)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an age such as 300s, 5m or 1h, got {text!r}") from None


def heartbeat_age(status: dict[str, Any], now: datetime | None = None) -> float | None:
    """Seconds since the status's heartbeat (its start time when an older job wrote it); None when it has none."""
    at = status.get("heartbeat_at") or status.get("started_at")
    if not at:
        return None
    return ((now or datetime.now(UTC)) - datetime.fromisoformat(at)).total_seconds()


if __name__ == "__main__":
    sys.exit(main())
