"""A table's figures for one batch: what the per-table log line says and status.json keeps (app/state/status.py)."""
from __future__ import annotations

from dataclasses import dataclass, field

from app.wire.registry import SchemaRef


@dataclass
class TableBatchStats:
    """Counts for one table in one batch; `log_line` is the per-table batch log line."""

    table: str
    rows_in: int = 0
    upserts: int = 0
    deletes: int = 0
    skipped: int = 0
    superseded: int = 0
    blocked: int = 0
    unresolved: int = 0
    replayed: int = 0  # records whose offsets the table had committed already (a replayed batch)
    dead_letters: int = 0  # records sent to the dead letters (app/sink/deadletters.py)
    dead_letter_kinds: dict[str, int] = field(default_factory=dict)  # the same, per error kind
    diverged_keys: list[str] = field(default_factory=list)  # record keys (JSON) of those records, sorted
    settled: int = 0  # dead letters of the table settled by the batch's snapshot reads (app/batch/writer.py: settle)
    settled_keys: list[str] = field(default_factory=list)  # their record keys, sorted
    pending_keys: list[str] | None = None  # after settling: the table's keys still diverged (None: not settled)
    quarantined: str | None = None  # why, when the table is quarantined (app/sink/quarantine.py)
    refused: str | None = None  # why, when the table is lost and its records are not written (app/sink/lost.py)
    schema_ids: list[SchemaRef] = field(default_factory=list)
    duration_s: float = 0.0
    max_source_ts_ms: int | None = None  # the newest source commit time (`source.ts_ms`) among its events
    topics: list[str] = field(default_factory=list)  # set when the table is not just its topic's own
    steps_s: dict[str, float] = field(default_factory=dict)  # seconds in each step of its unit (app/batch/writer.py)

    def log_line(self, batch_id: int) -> str:
        fed_by = f"topics={','.join(self.topics)} " if self.topics else ""
        return (
            f"batch={batch_id} table={self.table} {fed_by}rows_in={self.rows_in} upserts={self.upserts} "
            f"deletes={self.deletes} skipped={self.skipped} superseded={self.superseded} "
            f"blocked={self.blocked} unresolved={self.unresolved} replayed={self.replayed} "
            f"dead_letters={self.dead_letters} "
            + ("QUARANTINED " if self.quarantined else "") + ("REFUSED (lost) " if self.refused else "") +
            f"schema_ids={','.join(map(str, self.schema_ids))} duration_s={self.duration_s:.2f}"
            + (" steps=" + ",".join(f"{name.replace(' ', '_')}:{s:.2f}" for name, s in self.steps_s.items())
               if self.steps_s else "")
        )
