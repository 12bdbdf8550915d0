"""The job config's sections: frozen dataclasses, one per YAML mapping (app/config/load.py builds them)."""
from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from typing import Final, Literal

from app.config.partitions import PartitionSpec

# How the source's converter frames ids (app/wire/framing.py): ids in Apicurio headers, 0x00 + 8-byte id, 0x00 + 4-byte
# id (Confluent compatible), or detected per record.
FramingMode = Literal["headers", "id8", "id4", "auto"]
IdType = Literal["contentId", "globalId"]
# hard: a delete removes the row (its position kept in the table's delete ledger); soft: the row stays, flagged.
DeleteMode = Literal["hard", "soft"]
# What a TRUNCATE upstream does to the Silver table (the connector must send it: `skipped.operations=none`).
TruncateMode = Literal["ignore", "clear"]
# What happens to the rows a full snapshot of a table did not read (app/cdc/derived.py).
UnreadRowsMode = Literal["keep", "delete"]
# Copy-on-Write rewrites a file per update (fast reads); Merge-on-Read appends log files, compacted inline.
TableType = Literal["COPY_ON_WRITE", "MERGE_ON_READ"]
# Which Debezium connector feeds a source; mariadb and mysql share the binlog position.
ConnectorName = Literal["auto", "postgresql", "mysql", "mariadb", "sqlserver"]


@dataclass(frozen=True)
class KafkaConfig:
    # The brokers, `host:port` separated by commas (MSK: its bootstrap string).
    bootstrap_servers: str
    # Regex of the topics to read, matched against the whole topic name (the job anchors it).
    topic_pattern: str
    # Where a query without a checkpoint starts reading: `earliest` or `latest`.
    starting_offsets: Literal["earliest", "latest"] = "earliest"
    # At most this many Kafka records per micro-batch; unset: all that are there.
    max_offsets_per_trigger: int | None = None
    # Stop when offsets the checkpoint expects are gone (Kafka retention passed); false: skip them.
    fail_on_data_loss: bool = True
    # How long the broker may hold an executor's fetch waiting for more records (Kafka's fetch.max.wait.ms, whose
    # default, 500, made each batch's first read wait about 0.35 s on the local stack; docs/performance.md).
    fetch_max_wait_ms: int = 10
    # Extra Kafka client options passed as kafka.<key> (security settings, timeouts).
    options: dict[str, str] = field(default_factory=dict)


AUTH_FIELDS: Final = {
    "none": (),
    "basic": ("username", "password_env"),
    "oidc": ("client_id", "client_secret_env", "token_url"),
}


@dataclass(frozen=True)
class RegistryAuthConfig:
    """How the registry client authenticates. Secrets are named by environment variable, never written here.

    basic: HTTP Basic with `username` and the password in `$<password_env>` (Apicurio exchanges them at its OIDC
    token endpoint). oidc: OAuth2 client credentials at `token_url` with `client_id` and the secret in
    `$<client_secret_env>`; the bearer token is renewed `refresh_margin_s` before it expires.
    """

    # How the registry client authenticates: `none`, `basic` or `oidc` (each needs its own keys below).
    type: Literal["none", "basic", "oidc"] = "none"
    # basic: the user name.
    username: str | None = None
    # basic: the environment variable holding the password.
    password_env: str | None = None
    # oidc: the client id.
    client_id: str | None = None
    # oidc: the environment variable holding the client secret.
    client_secret_env: str | None = None
    # oidc: the token endpoint.
    token_url: str | None = None
    # oidc: the scope asked for; unset: none.
    scope: str | None = None
    # oidc: the bearer token is renewed this many seconds before it expires.
    refresh_margin_s: float = 30.0

    def secret(self) -> str:
        """The password (basic) or client secret (oidc), read from the environment; empty for none."""
        env = self.password_env if self.type == "basic" else self.client_secret_env
        return os.environ.get(env, "") if env else ""


@dataclass(frozen=True)
class RegistryConfig:
    # The Apicurio Registry's base URL (without `/apis/...`).
    url: str
    # v3 and v2: Apicurio's own APIs; ccompat: its Confluent-compatible API (/apis/ccompat/v7), where an id is a
    # contentId unless the registry runs in legacy-id mode (then a globalId).
    api: Literal["v3", "v2", "ccompat"] = "v3"
    # How the client authenticates (`registry.auth.*`).
    auth: RegistryAuthConfig = field(default_factory=RegistryAuthConfig)
    # Timeout of one registry request, in seconds.
    timeout_s: float = 10.0
    # Retries of a request failing with 5xx, 429 or a connection error, with exponential backoff.
    retries: int = 4
    # The first retry's wait in seconds, doubled for each next one.
    backoff_s: float = 0.5


@dataclass(frozen=True)
class DiscriminatorConfig:
    """What keeps apart the rows of several source tables merged into one Silver table (docs/sources.md
    "Partitioned and sharded sources"). With `value`, the job adds `column` holding that constant to every row of
    this source table; without, `column` is one of the table's own columns (a tenant id). Either way it joins the
    record key.
    """

    # The discriminator column: one the job adds (with `value`) or one of the table's own.
    column: str
    # The constant the job writes to `column` for this source table; unset: `column` is the table's own.
    value: str | None = None


@dataclass(frozen=True)
class TableConfig:
    """Per-table overrides, keyed by '<schema>.<table>' of the source ('<database>.<schema>.<table>' for SQL
    Server, whose topics name all three)."""

    # The Silver table's name; unset: `<schema>_<table>` (docs/sources.md "Several sources").
    name: str | None = None
    # Several source tables given one `name` merge into one Silver table (shards); each then needs a
    # discriminator, or all declare their keys unique across the merged tables.
    discriminator: DiscriminatorConfig | None = None
    # The merged source tables' keys never collide, so no discriminator is needed.
    unique_keys: bool = False
    # The Silver record key's columns; unset: the fields of the Debezium key schema.
    record_key: list[str] | None = None
    delete_mode: DeleteMode | None = None  # unset: lake.delete_mode
    truncate: TruncateMode | None = None  # unset: lake.truncate
    unread_rows: UnreadRowsMode | None = None  # unset: lake.unread_rows
    table_type: TableType | None = None  # unset: lake.table_type
    # `column`, `day(column)`, `month(column)` or `year(column)` (app/sink/partitioning.py); unset: not partitioned.
    partition_by: str | None = None
    compaction_delta_commits: int | None = None  # Merge-on-Read; unset: lake.compaction_delta_commits

    @property
    def partition(self) -> PartitionSpec | None:
        return None if self.partition_by is None else PartitionSpec.parse(self.partition_by)


@dataclass(frozen=True)
class SourceCatalogConfig:
    """A read-only login to the source database's catalog (the connector's own login will do)."""

    # JDBC URL of the source PostgreSQL database.
    jdbc_url: str
    # A login that may read its catalog (the connector's will do).
    user: str
    # The environment variable holding that login's password.
    password_env: str

    @property
    def password(self) -> str:
        return os.environ.get(self.password_env, "")


@dataclass(frozen=True)
class SourceConfig:
    """One Debezium connector's topics: `<topic_prefix>.<schema>.<table>` (SQL Server:
    `<topic_prefix>.<database>.<schema>.<table>`)."""

    # The connector's `topic.prefix`: its topics are `<topic_prefix>.<schema>.<table>`.
    topic_prefix: str
    # Names the source in errors and logs; unset: the topic prefix.
    name: str | None = None
    # The connector whose events these are; `auto` reads it off each writer schema's `source` record. When set,
    # an event of another connector is refused (its ordering would be read from the wrong fields).
    connector: ConnectorName = "auto"
    # Debezium envelopes, or events Debezium's unwrap SMT flattened (docs/sources.md "Unwrap-SMT events"); `auto` tells
    # them apart per writer schema. When set, the other kind is refused.
    events: Literal["auto", "envelope", "flattened"] = "auto"
    # How the converter frames schema ids: `headers`, `id8`, `id4` (Confluent compatible) or `auto` (per record).
    framing: FramingMode = "id4"
    id_type: IdType = "contentId"  # the id a 0x00-prefixed framing carries; header framing names its own
    # The catalog database of this source's Silver tables; unset: lake.database.
    database: str | None = None
    # Per-table settings, keyed `"<schema>.<table>"` (`tables."<schema>.<table>".*`).
    tables: dict[str, TableConfig] = field(default_factory=dict)
    # PostgreSQL: where the job reads which captured tables are partitions of a partitioned table (pg_inherits,
    # through pg_partition_root), so that every partition's topic lands in the partitioned table's one Silver
    # table. Unset: each topic is a table of its own.
    catalog: SourceCatalogConfig | None = None
    # The connector's Kafka signal topic (its `signal.kafka.topic`, with `signal.enabled.channels` holding `kafka`):
    # when a column is added upstream (see snapshot_new_columns), the job asks the connector there for an
    # incremental snapshot of the table, so that the rows written before read as the source has them
    # (docs/schema-changes.md). Unset: the job logs the snapshot to run instead.
    signal_topic: str | None = None
    # Which columns added upstream make the job ask for that snapshot: `all` (the rows written before may hold a
    # default no event schema shows: a function default arrives without one, on MariaDB always), `with_default`
    # (only columns whose event schema declares a default: cheaper, misses such function defaults) or `none`.
    snapshot_new_columns: Literal["all", "with_default", "none"] = "all"
    # The table the connector's `heartbeat.action.query` writes (`"<schema>.<table>"`, as under `tables`): its
    # topic feeds no Silver table (its records go to Bronze); like the heartbeat topic, its records tell the job
    # that the connector still moves along the source's log (docs/running.md "Source stalled"). Unset: the table,
    # if captured, is a table like any other.
    heartbeat_table: str | None = None

    @property
    def label(self) -> str:
        return self.name or self.topic_prefix

    def table_config(self, *parts: str) -> TableConfig:
        return self.tables.get(".".join(parts), TableConfig())


@dataclass(frozen=True)
class LakeConfig:
    # The catalog (Hive metastore / Glue) database of the Silver tables.
    database: str
    # Where the Silver tables live: `s3a://...` or a local path.
    silver_path: str
    # Where the Bronze copy of every Kafka record lives.
    bronze_path: str
    # Where the streaming query's checkpoint and status.json live.
    checkpoint_path: str
    # The Hudi table type of every table: `COPY_ON_WRITE` or `MERGE_ON_READ`.
    table_type: TableType = "COPY_ON_WRITE"
    # `hard`: a delete removes the row; `soft`: the row stays, flagged.
    delete_mode: DeleteMode = "hard"
    # A truncate event (the connector sends them with `skipped.operations=none`): `ignore` skips it, the rows stay;
    # `clear` deletes every row written before it, in source order with the table's other events (a table fed by
    # one topic; docs/sources.md "Truncates").
    truncate: TruncateMode = "ignore"
    # After a full snapshot's last read of a table (an initial or blocking snapshot, or a connector's snapshot after
    # its offsets were lost): `delete` deletes the Silver rows the snapshot did not read (gone upstream while no
    # change streamed); `keep` leaves them. `delete` only where every full snapshot of the table reads all its rows:
    # no `additional-conditions` in a blocking snapshot's signal, no `snapshot.select.statement.overrides`, no
    # custom snapshot query (docs/concepts.md "Snapshots under live writes").
    unread_rows: UnreadRowsMode = "keep"
    # Merge-on-Read tables compact their log files inline once this many delta commits have piled up.
    compaction_delta_commits: int = 3
    # The cleaner keeps the files of this many latest commits (time travel and incremental reads reach back
    # that far); the timeline archives beyond retain_commits + 10.
    retain_commits: int = 10
    # The cleaner is scheduled once this many commits have passed since its last run (Hudi's
    # `hoodie.clean.trigger.max.commits`), not after every commit: a clean plans, deletes and writes three timeline
    # files, about a tenth of a small commit (docs/performance.md). An old file version stays up to this many
    # commits less one past those retained.
    clean_every_commits: int = 5
    # A batch's inserts into a table go into its base files smaller than this many MB (Hudi's
    # `hoodie.parquet.small.file.limit`), and a Copy-on-Write commit rewrites each such file whole: a table taking
    # a steady stream of inserts rewrites a file that grows until it passes this size. 0: every batch's inserts go
    # to new files. conf/local.yaml sets 0.25 (the local stack's small tables; docs/performance.md).
    small_file_limit_mb: float = 100.0
    # A table without a partition column finds its rows' files with Hudi's simple index: it reads every base file's
    # keys and joins them with the batch's, in one task per base file by default (Hudi's), which a table whose files
    # multiply (small_file_limit_mb) pays at every commit. At most this many tasks; unset: the session's cores
    # (Spark's default parallelism); 0: Hudi's default (docs/performance.md).
    simple_index_tasks: int | None = None
    # A batch's tables are written this many at a time, each table's unit on a thread of its own (its Spark jobs
    # in a FAIR scheduler pool of their own), each unit building its table's decode plan first (on the driver's
    # cores, beside the Bronze write, which a unit waits for before its first write); 1 plans and writes them one
    # after another. Four, not three: on 7 tables the seventh is not left alone on the two cores (B2's run 12.78 s
    # against 13.24 s, B3's p95 on 7 tables within the machine's spread; docs/performance.md).
    table_writers: int = 4
    # A table's records in a batch, up to this many, are judged and written from one Spark partition: its latest
    # event per key and its counts need no shuffle, and its Hudi upsert runs fewer tasks (B3's count step 12-20%
    # shorter; docs/performance.md). Above it, they keep the batch's partitions. 0: never.
    single_partition_rows: int = 20000
    # Which tables keep Hudi's metadata table: `partitioned` (their record-level index lives in it) or `all`. A
    # table without a partition column needs none (its one folder is listed, its keys found by the simple index),
    # and its commits cost about 40% less CPU without one (docs/performance.md).
    metadata_table: Literal["partitioned", "all"] = "partitioned"
    # When Hudi's meta sync runs after a commit: `on_change` (a table's first write in the run, new columns, every
    # commit of a partitioned table; app/sink/metasync.py) or `every_commit`.
    meta_sync: Literal["on_change", "every_commit"] = "on_change"
    # A catalog table over Bronze in `lake.database`, such as `cdc_bronze` (docs/concepts.md "Bronze in the
    # catalog"): its partitions are Bronze's complete range folders, so readers see only complete ranges. Empty (the
    # default): no such table (each batch would add a metastore statement).
    bronze_table: str = ""
    # A table's write failing with a transient error (object-store throttling or unavailability, a connection or
    # metastore timeout) is tried again this many times, 5 s later, then 10 s, 20 s...; then the batch fails and is
    # read again at the next start. Never a reason to quarantine a table (app/sink/quarantine.py).
    write_retries: int = 3

    @property
    def small_file_bytes(self) -> int:
        return round(self.small_file_limit_mb * 1024 * 1024)

    def table_path(self, table: str, database: str | None = None) -> str:
        """Where a Silver table lives: <silver_path>/<database>/<table> (lake.database unless given)."""
        return f"{self.silver_path.rstrip('/')}/{database or self.database}/{table}"


@dataclass(frozen=True)
class MetastoreConfig:
    # JDBC URL of the Hive metastore's database (local stack: PostgreSQL).
    jdbc_url: str
    # The metastore database's user.
    user: str
    # The environment variable holding its password.
    password_env: str = "METASTORE_PASSWORD"
    # The metastore's warehouse folder (for tables created without a location).
    warehouse_path: str = "spark-warehouse"

    @property
    def password(self) -> str:
        return os.environ.get(self.password_env, "")


@dataclass(frozen=True)
class SparkConfig:
    # The Spark master; unset: spark-submit's (EMR: YARN).
    master: str | None = None
    # A folder whose jars join the session (the local stack's `.deps/spark`); unset on EMR.
    jars_dir: str | None = None
    # A class-data sharing archive of the driver's classes (scripts/setup.sh makes `.deps/cds/spark.jsa` for the jars
    # of jars_dir): the driver JVM maps Spark's, Hudi's and Hadoop's classes from it at start instead of loading and
    # verifying them (docs/performance.md). Used when the file exists and the JVM's class path is the one it was
    # made with; otherwise the JVM loads its classes as usual. Unset: none (EMR).
    class_archive: str | None = None
    # Driver JVM options added for an `--available-now` run only, a process that ends once its backlog is written,
    # where the JIT's warm-up is much of the run (the C1 compiler only and the parallel collector: the demo's runs
    # faster, a large backlog slower, docs/performance.md). A stream does not get them: C2 pays back. Their collector
    # must be the one `spark.driver.extraJavaOptions` names, if any (a JVM given two refuses to start); one that
    # JAVA_TOOL_OPTIONS, JDK_JAVA_OPTIONS or _JAVA_OPTIONS names replaces theirs (a WARNING says so). Under
    # spark-submit the driver starts first: scripts/submit.sh passes them (an EMR step: --driver-java-options).
    # Unset: none.
    available_now_java_options: str | None = None
    # The `available_now_java_options` only for a run whose topics hold at most this many records, counted by a
    # Kafka client before the JVM starts (app/wire/source.py `retained_records`: every record they retain, checkpoint
    # or not, so an upper bound of the run's backlog; a count that fails, confluent-kafka missing say, gives none).
    # A larger backlog keeps the JVM's defaults, which pay back over it. Unset: every `--available-now` run.
    available_now_java_options_max_records: int | None = None
    # Driver JVM options added for a stream only (a run without `--available-now`), after the others: on a machine
    # whose cores the job shares, the parallel collector gives shorter batches than G1 (conf/local.yaml;
    # docs/performance.md). Their collector must be the one
    # `spark.driver.extraJavaOptions` names, if any; one that the environment's JVM options name replaces theirs, as
    # above. Under spark-submit the driver starts first: scripts/submit.sh passes them (an EMR step, the image:
    # --driver-java-options). Unset: none.
    stream_java_options: str | None = None
    # Which of Hadoop's default configuration files every Hadoop configuration of the driver reads: `all` (Hadoop's
    # own list: core, HDFS, MapReduce and YARN, their -default.xml and -site.xml files) or `core` (core-default.xml
    # and core-site.xml only). Each Hudi write carries its configuration in the closures it sends to its tasks and
    # reads those files again for each Parquet file it opens: with `core` a configuration is a third of the size
    # (363 entries against 990) and quicker to build (docs/performance.md). `core` is for a driver with no HDFS,
    # MapReduce or YARN cluster to talk to (local mode, the lake on S3, as conf/local.yaml); on EMR (YARN) keep `all`.
    hadoop_defaults: Literal["all", "core"] = "all"
    # Extra Spark settings, passed as they are.
    conf: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class DeadLetterConfig:
    """What happens to a record the job cannot decode or apply (docs/when-things-go-wrong.md "Dead letters").

    `dead_letter`: it goes to the dead-letter table `<lake.silver_path>/<lake.database>/<table>` (a Hudi table in
    the catalog like the others, one row per Kafka record) and every table keeps flowing. `fail_fast`: the batch
    stops with an error naming the record, and so does every restart until the record is dealt with.
    """

    # `dead_letter`: an unusable record goes to the dead-letter table; `fail_fast`: the batch stops, naming it.
    mode: Literal["dead_letter", "fail_fast"] = "dead_letter"
    # The dead-letter table's name in `lake.database`.
    table: str = "cdc_dead_letters"
    # A schema id the registry answers 404 for is asked again (backing off) for this long after it was first
    # seen, since a registry replica can lag behind the one the producer registered with; then its records are
    # dead letters.
    unknown_schema_grace_s: float = 60.0


@dataclass(frozen=True)
class TriggerConfig:
    # The micro-batch interval (a Spark duration, e.g. `30 seconds`).
    processing_time: str = "30 seconds"


@dataclass(frozen=True)
class RecoveryConfig:
    """How the job rides out an outage of the broker, the registry, the object store or the metastore: the query
    stops, and the job starts it again from its checkpoint after a wait, doubled each time (app/recovery.py)."""

    # The first wait, in seconds, before the query is started again after a failure that an outage explains.
    backoff_s: float = 5.0
    # The longest wait between two attempts, in seconds.
    max_backoff_s: float = 120.0
    # The job gives up (exit 1, naming what it waited for) once an outage has lasted this many seconds without a
    # batch completing; 0: it never gives up.
    give_up_after_s: float = 1800.0
    # status.json's `heartbeat_at` is rewritten this often (seconds), also while no batch runs and during an outage,
    # so `scripts/status.py --max-age` tells a job that died from an idle one.
    heartbeat_s: float = 60.0
    # A source whose connector has delivered nothing (no change, no heartbeat) for this many seconds is stalled: a
    # warning names it and the metric `source.<name>.stalled` is 1, checked on the heartbeat's timer, also while no
    # batch runs (docs/running.md "Source stalled"). Set it well above the connectors' `heartbeat.interval.ms`;
    # 0: never.
    source_stalled_after_s: float = 900.0


@dataclass(frozen=True)
class JobConfig:
    """The job. Its sources are either one `source` (with the top-level `tables`) or a list `sources`, each with
    its own `tables`; `source_list` holds them all either way."""

    # The Kafka source (`kafka.*`).
    kafka: KafkaConfig
    # The schema registry (`registry.*`).
    registry: RegistryConfig
    # Where and how the tables are written (`lake.*`).
    lake: LakeConfig
    # One connector's topics (`source.*`); or `sources`, not both.
    source: SourceConfig | None = None
    # Several connectors' topics, a list of `source` mappings each with its own `tables`.
    sources: list[SourceConfig] = field(default_factory=list)
    # The metastore database the job's session opens (`metastore.*`); unset: the session's own catalog (EMR: the
    # cluster's Hive or Glue client). Hudi's meta sync writes to it either way.
    metastore: MetastoreConfig | None = None
    # Session settings (`spark.*`).
    spark: SparkConfig = field(default_factory=SparkConfig)
    # When micro-batches run (`trigger.*`).
    trigger: TriggerConfig = field(default_factory=TriggerConfig)
    # With `source`: per-table settings, keyed `"<schema>.<table>"`.
    tables: dict[str, TableConfig] = field(default_factory=dict)
    # What happens to records the job cannot use (`dead_letters.*`).
    dead_letters: DeadLetterConfig = field(default_factory=DeadLetterConfig)
    # How outages are ridden out (`recovery.*`).
    recovery: RecoveryConfig = field(default_factory=RecoveryConfig)
    # The job's logging level (a top-level key).
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"

    @property
    def source_list(self) -> list[SourceConfig]:
        """Every source: the single `source` with the top-level `tables`, or `sources`."""
        if self.source is None:
            return self.sources
        return [replace(self.source, tables=self.source.tables or self.tables)]

    def source_key(self, n: int) -> str:
        """How messages name the n-th source's settings: `source`, or `sources[<n>]`."""
        return "source" if self.source is not None else f"sources[{n}]"

    def tables_key(self, n: int) -> str:
        """How messages name the n-th source's per-table settings: the top-level `tables` (one `source` without
        tables of its own), else `<source key>.tables`."""
        return "tables" if self.source is not None and not self.source.tables else f"{self.source_key(n)}.tables"

    def table_setting_key(self, source_label: str, table: str, setting: str) -> str:
        """The dotted key of one table's setting as this config spells it, e.g. `sources[1].tables."dbo.orders".name`,
        for the source labelled `source_label` (its first source when none is)."""
        n = next((i for i, s in enumerate(self.source_list) if s.label == source_label), 0)
        return f'{self.tables_key(n)}."{table}".{setting}'

    def source_of(self, topic: str) -> SourceConfig | None:
        """The source whose prefix the topic starts with (the longest, should one prefix extend another)."""
        matches = [s for s in self.source_list if topic.startswith(s.topic_prefix + ".")]
        return max(matches, key=lambda s: len(s.topic_prefix)) if matches else None

    def database_of(self, source: SourceConfig) -> str:
        return source.database or self.lake.database

    @property
    def databases(self) -> list[str]:
        """Every catalog database the job writes Silver tables to."""
        return sorted({self.database_of(s) for s in self.source_list})
