"""Silver tables no subscribed topic feeds any longer, and topics that now feed another table than the one
holding their applied offsets: found at start from each table's last commit, shown in status.json
(app/state/status.py) and refused when the job would skip offsets (`reroute_error`)."""
from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from pyspark.sql import SparkSession

from app.config import JobConfig
from app.errors import RerouteError
from app.routing.route import TableRoute
from app.sink.commit import Committed, last_committed
from app.state.resume import silver_tables
from app.state.status import why

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Rerouted:
    """A topic that now feeds another table than the one holding its applied offsets (`stale_tables`)."""

    topic: str
    old_table: str  # qualified names
    new_table: str
    why: str  # why the topic feeds new_table, or ''
    last: dict[int, int]  # the last offset old_table applied, per partition

    def message(self) -> str:
        offsets = ", ".join(f"[{p}]@{o}" for p, o in sorted(self.last.items()))
        how = f" ({self.why})" if self.why else ""
        return (f"topic {self.topic} feeds {self.new_table} now{how}, but its offsets up to {offsets} were applied "
                f"to {self.old_table}, which no subscribed topic feeds any longer, and {self.new_table} has not "
                f"applied them")


def stale_tables(
    spark: SparkSession, config: JobConfig, routes: Iterable[TableRoute]
) -> tuple[dict[str, str], list[Rerouted]]:
    """Silver tables of the job's databases that no subscribed topic feeds, by qualified name, each with why
    (where their topics go now), and the topics among theirs that now feed another table which has not applied
    their offsets (a table per partition made before `catalog` was set, a table renamed). Read from each table's
    last commit (`_cdc.committed`); tables that record no offsets, or only offsets of topics of none of the job's
    sources (another job's tables in a shared database), are left out."""
    routes = list(routes)
    fed = {r.qualified_name for r in routes}
    by_topic = {r.topic: r for r in routes}
    paths = {}
    stale: dict[str, str] = {}
    rerouted: list[Rerouted] = []
    applied_by: dict[str, Committed | None] = {}  # the tables topics feed now: their last commit
    for path in silver_tables(spark, config):
        database, table = path.rstrip("/").split("/")[-2:]
        paths[f"{database}.{table}"] = path
    for name, path in sorted(paths.items()):
        if name in fed:
            continue
        committed = last_committed(spark, path)
        if committed is None or not any(config.source_of(t) for t, _ in committed.last):
            continue  # nothing says what fed it, or another job's sources did
        reasons = []
        for topic in sorted({t for t, _ in committed.last}):
            route = by_topic.get(topic)
            if route is None:
                reasons.append(f"{topic} is not subscribed (kafka.topic_pattern) or does not exist any longer")
                continue
            reason = why(route)
            reasons.append(f"{topic} now feeds {route.qualified_name}" + (f" ({reason})" if reason else ""))
            last = {p: o for (t, p), o in committed.last.items() if t == topic}
            if route.qualified_name not in applied_by:  # each table's timeline read once
                new_path = paths.get(route.qualified_name)
                applied_by[route.qualified_name] = last_committed(spark, new_path) if new_path else None
            applied = applied_by[route.qualified_name]
            if applied is None or any(applied.last.get((topic, p), -1) < o for p, o in last.items()):
                rerouted.append(Rerouted(topic, name, route.qualified_name, reason, last))
        stale[name] = "; ".join(reasons) or "its commits name no topic"
    return stale, rerouted


def log_stale(stale: Mapping[str, str]) -> None:
    for name, reason in sorted(stale.items()):
        log.warning(
            "Silver table %s is fed by no topic this job subscribes to and stays as it is: %s. Its rows are not "
            "in the table its topics feed now unless replayed there (docs/sources.md \"Partitioned and sharded "
            "sources\"); drop it when it is not needed", name, reason,
        )


def reroute_error(rerouted: list[Rerouted]) -> RerouteError:
    """The refusal to start with this checkpoint, naming each topic, its tables and the remedy."""
    return RerouteError(
        "; ".join(r.message() for r in rerouted) + ". With this checkpoint the job would read on after those "
        "offsets, and the tables would miss them: replay them, i.e. drop "
        f"{', '.join(sorted({r.old_table for r in rerouted}))} (catalog and folder), then start with a new "
        f"lake.checkpoint_path and --from-starting-offsets (kafka.starting_offsets: earliest, within Kafka's "
        f"retention); or undo the config change (docs/sources.md \"Partitioned and sharded sources\")"
    )


def table_holder(spark: SparkSession, config: JobConfig) -> Callable[[list[TableRoute]], TableRoute | None]:
    """For routes contesting one Silver table (app/routing/route.py `claim_routes`): the one whose offsets the
    table's last commit holds (the same source table, or the same topic for commits that do not record it), if
    any; the table's timeline is read then only."""

    def holder(routes: list[TableRoute]) -> TableRoute | None:
        committed = last_committed(spark, config.lake.table_path(routes[0].table, routes[0].database))
        if committed is None:
            return None
        topics = {t for t, _ in committed.last}
        return next((r for r in routes if r.source_identity == committed.source_table), None) or next(
            (r for r in routes if committed.source_table is None and r.topic in topics), None)

    return holder
