"""Every column the job adds to the rows it writes or carries between its steps: the one place their names are
spelled. Silver rows carry CDC_COLUMNS (KEY_LENGTHS_COL only in some tables; SOFT_DELETE_COLUMNS in soft-delete
tables); the others live only between a batch's steps and are dropped before a write."""
from __future__ import annotations

from typing import Final

from app.wire.decode import ERROR_COL as DECODE_ERROR_COL

# Columns the pipeline adds to every Silver row.
POSITION_COL: Final = "_cdc_position"  # the connector's source position, ordered as text (app/cdc/position.py)
OP_COL: Final = "_cdc_op"
SOURCE_TS_COL: Final = "_cdc_source_ts_ms"
PARTITION_COL: Final = "_kafka_partition"
OFFSET_COL: Final = "_kafka_offset"
DELETED_COL: Final = "_hoodie_is_deleted"  # Hudi removes the record: hard deletes
# Tables created with a composite record key holding a text column only: the length of each text key column's
# value, so that Hudi's unescaped `column:value,...` key text cannot be the same for two keys (app/sink/hudi.py).
KEY_LENGTHS_COL: Final = "_cdc_key_lengths"
CDC_COLUMNS = (OP_COL, POSITION_COL, SOURCE_TS_COL, PARTITION_COL, OFFSET_COL, DELETED_COL, KEY_LENGTHS_COL)
# Soft-delete tables only: the row stays, flagged, with the source time of its delete.
SOFT_DELETED_COL: Final = "_cdc_deleted"
SOFT_DELETED_AT_COL: Final = "_cdc_deleted_at"
SOFT_DELETE_COLUMNS = (SOFT_DELETED_COL, SOFT_DELETED_AT_COL)

# Internal, never written: the value columns an event does not carry (their value comes from the key's
# previous version), and the flag of the latest event per key.
UNAVAILABLE_COL: Final = "_cdc_unavailable"
LATEST_COL: Final = "_cdc_is_latest"
TOPIC_COL: Final = "_cdc_topic"  # a table fed by several topics (app/batch/merge.py): which one, until written
# Why an event cannot be applied, struct<kind: string, message: string>; null for a good one. Spelled where the
# decode sets it first (app/wire/decode.py, a lower layer); app/cdc/unwrap.py adds its own kinds. Such an event never
# orders, carries or is written: it goes to the dead letters (app/sink/deadletters.py).
ERROR_COL: Final = DECODE_ERROR_COL
# A full snapshot's last read of a table (Debezium's `source.snapshot` `last` or `last_in_data_collection`: an
# initial or blocking snapshot, or a connector's snapshot after its offsets were lost): rows it did not read are
# gone upstream (app/cdc/derived.py).
SNAPSHOT_END_COL: Final = "_cdc_snapshot_end"
INTERNAL_COLUMNS = (UNAVAILABLE_COL, LATEST_COL, ERROR_COL, SNAPSHOT_END_COL)
SEGMENT_COL: Final = "_cdc_segment"  # an event's place among its key's events (app/cdc/unwrap.py)

# The delete ledger's verdict on each event (app/sink/ledger.py), and the ledger table's own position column.
LEDGER_POSITION_COL: Final = "_cdc_ledger_position"
LEDGER_KEY_COL: Final = "_cdc_ledger_key"  # the record key as JSON: {"<column>": value, ...}
BLOCKED_COL: Final = "_cdc_blocked"  # an upsert at or below its key's delete position
REINSERT_COL: Final = "_cdc_reinsert"  # an upsert above it: the key leaves the ledger

# Where a hard-delete table's ledger lives, beside the tables of its database: <database folder>/<this>/<table>.
LEDGER_FOLDER: Final = "_cdc_delete_ledger"
