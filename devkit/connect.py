"""Kafka Connect REST client: register the Debezium PostgreSQL and MariaDB connectors with the Apicurio Avro
converter.

Used by the demo and the end-to-end tests against the local stack; the connector config mirrors what a user
deploys on MSK Connect. `converter_config` gives the Apicurio 2.6 converter settings that produce each wire
framing the job reads (app/wire/framing.py); the default is Confluent-compatible `0x00` + 4-byte contentId.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import requests
from confluent_kafka.admin import AdminClient

log = logging.getLogger(__name__)

# How long a connector sleeps when it finds no new change (Debezium's `poll.interval.ms`, 500 by default). At a
# steady trickle of changes a change reached Kafka 0.4-0.6 s after its commit (p95 0.8-0.9 s) with 500, 0.05 s
# (p95 0.09 s) with 50; an idle connector then wakes 20 times a second (docs/sources.md "Connector settings").
POLL_INTERVAL_MS = 50


@dataclass(frozen=True)
class PostgresSource:
    host: str
    port: int
    user: str
    password: str
    dbname: str


@dataclass(frozen=True)
class MariaDbSource:
    host: str
    port: int
    user: str
    password: str


def converter_config(registry_url: str, framing: str = "id4", id_type: str = "contentId") -> dict[str, str]:
    """Key and value converter settings for one wire framing of the Apicurio 2.6 Avro converter.

    Args:
        registry_url: the registry's base URL; the 2.6 converter talks to its v2 API.
        framing: "headers" (ids in record headers `apicurio.{key,value}.<id_type>`, 8 bytes, raw Avro body;
            the 2.6 converter's default), "id8" (`0x00` + 8-byte id: headers off, the default id handler) or
            "id4" (`0x00` + 4-byte id: headers off, as-confluent, which picks the 4-byte id handler).
        id_type: which id the converter writes (`apicurio.registry.use-id`): "contentId" or "globalId".
    """
    if framing not in ("headers", "id8", "id4"):
        raise ValueError(f"framing must be headers, id8 or id4; got {framing!r}")
    if id_type not in ("contentId", "globalId"):
        raise ValueError(f"id_type must be contentId or globalId; got {id_type!r}")
    per_side: dict[str, str] = {
        "apicurio.registry.url": f"{registry_url.rstrip('/')}/apis/registry/v2",
        "apicurio.registry.auto-register": "true",
        "apicurio.registry.find-latest": "true",
        "apicurio.registry.use-id": id_type,
        "apicurio.registry.headers.enabled": str(framing == "headers").lower(),
    }
    if framing == "id8":
        per_side["apicurio.registry.id-handler"] = "io.apicurio.registry.serde.DefaultIdHandler"
    if framing == "id4":
        per_side["apicurio.registry.as-confluent"] = "true"
    conf: dict[str, str] = {}
    for side in ("key", "value"):
        conf[f"{side}.converter"] = "io.apicurio.registry.utils.converter.AvroConverter"
        conf.update({f"{side}.converter.{k}": v for k, v in per_side.items()})
    return conf


# The project's SMT (jvm/ io.cdclake.connect): a NULL in a nullable column with a default reaches Kafka as NULL.
# The Apicurio 2.6 converter otherwise writes the column's default for it (docs/schema-changes.md "Defaults").
DEFAULTS_SMT: dict[str, str] = {"transforms.defaults.type": "io.cdclake.connect.DefaultsAsParameters"}


def defaults_smt_config(*before: str) -> dict[str, str]:
    """The connector's `transforms`: those named in `before`, then the project's DefaultsAsParameters (last, so it
    sees the rows as they are written)."""
    return {"transforms": ",".join([*before, "defaults"]), **DEFAULTS_SMT}


def postgres_connector_config(
    name: str,
    source: PostgresSource,
    topic_prefix: str,
    schemas: list[str],
    registry_url: str,
    *,
    framing: str = "id4",
    id_type: str = "contentId",
    publish_via_partition_root: bool = False,
    schema_publication: bool = False,
) -> dict[str, str]:
    """A Debezium PostgreSQL connector (pgoutput) capturing `schemas` into `<topic_prefix>.<schema>.<table>`,
    its converters writing `framing` with `id_type` ids (see converter_config).

    `schema_publication`: the connector uses a publication made beforehand by `create_schema_publication` (`FOR
    TABLES IN SCHEMA`, PostgreSQL 15), which takes in a table created later in those schemas at once, without a
    connector restart (docs/sources.md "New tables"); otherwise Debezium creates a publication of the tables that
    exist at its start (`filtered`).

    `publish_via_partition_root`: a partitioned table's changes carry the partitioned table's name instead of
    each partition's. The connector applies it only when it creates the publication: check an existing one with
    `check_publication_mode` first.
    """
    return {
        "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
        "plugin.name": "pgoutput",
        "database.hostname": source.host,
        "database.port": str(source.port),
        "database.user": source.user,
        "database.password": source.password,
        "database.dbname": source.dbname,
        "topic.prefix": topic_prefix,
        "schema.include.list": ",".join(schemas),
        "slot.name": f"{name}_slot".replace("-", "_"),
        "publication.name": f"{name}_pub".replace("-", "_"),
        "publication.autocreate.mode": "disabled" if schema_publication else "filtered",
        "schema.name.adjustment.mode": "avro",
        "snapshot.mode": "initial",
        "poll.interval.ms": str(POLL_INTERVAL_MS),
        "publish.via.partition.root": str(publish_via_partition_root).lower(),
        **converter_config(registry_url, framing, id_type),
        **defaults_smt_config(),
    }


class PublicationModeError(RuntimeError):
    """An existing publication publishes partitioned tables the other way than the connector is set to."""


def check_publication_mode(connection: Any, publication: str, publish_via_partition_root: bool) -> None:
    """Refuse a connector whose publication already exists with the other `publish_via_partition_root`.

    Debezium sets the option only in CREATE PUBLICATION; an existing publication keeps its own, so the connector
    setting would be silently ignored.

    Args:
        connection: an open DB-API connection to the source database (psycopg or any other driver).

    Raises:
        PublicationModeError: names the publication, both modes and the statement that fixes it.
    """
    cursor = connection.cursor()
    cursor.execute("select pubviaroot from pg_catalog.pg_publication where pubname = %s", (publication,))
    row = cursor.fetchone()
    if row is None or bool(row[0]) == publish_via_partition_root:
        return
    raise PublicationModeError(
        f"publication {publication} exists with publish_via_partition_root = {str(bool(row[0])).lower()}, but the "
        f"connector sets publish.via.partition.root={str(publish_via_partition_root).lower()}, which Debezium "
        f"applies only when it creates the publication; run ALTER PUBLICATION {publication} SET "
        f"(publish_via_partition_root = {str(publish_via_partition_root).lower()}) (or drop it and let the "
        f"connector create it), or change the connector setting"
    )


def create_schema_publication(
    connection: Any, publication: str, schemas: list[str], publish_via_partition_root: bool = False
) -> None:
    """`CREATE PUBLICATION <publication> FOR TABLES IN SCHEMA <schemas>` unless it exists (PostgreSQL 15; a
    superuser's statement, as on RDS the `rds_superuser` role's)."""
    cursor = connection.cursor()
    cursor.execute("select 1 from pg_catalog.pg_publication where pubname = %s", (publication,))
    if cursor.fetchone() is None:
        via_root = str(publish_via_partition_root).lower()
        cursor.execute(f"create publication {publication} for tables in schema {', '.join(schemas)} "
                       f"with (publish_via_partition_root = {via_root})")


def drop_replication_slot(connection: Any, slot: str, timeout_s: float = 30.0) -> None:
    """Drop a deleted connector's replication slot once its walsender lets go of it (gone already: nothing)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        row = connection.execute("select active from pg_replication_slots where slot_name = %s", (slot,)).fetchone()
        if row is None:
            return
        if not row[0]:
            connection.execute("select pg_drop_replication_slot(%s)", (slot,))
            return
        time.sleep(0.5)


def delete_topics(bootstrap: str, prefixes: tuple[str, ...], timeout_s: float = 60.0) -> list[str]:
    """Delete the topics whose names start with one of `prefixes` and wait until the broker no longer lists them;
    the topics deleted. A connector's topics outlive it: without this, every benchmark run or demo reset leaves
    its topics on the broker for good."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    topics = [t for t in admin.list_topics(timeout=10).topics if t.startswith(prefixes)]
    if not topics:
        return []
    for future in admin.delete_topics(topics, operation_timeout=30).values():
        future.result()
    deadline = time.monotonic() + timeout_s
    while set(topics) & set(admin.list_topics(timeout=10).topics):
        if time.monotonic() > deadline:
            raise RuntimeError(f"topics not deleted after {timeout_s:.0f} s: {sorted(topics)}")
        time.sleep(0.5)
    return topics


def heartbeat_config(table: str, interval_ms: int = 10_000) -> dict[str, str]:
    """Debezium heartbeats every `interval_ms`, each also updating the one row of `table` (`<schema>.<table>`,
    made with `heartbeat_table_ddl`, captured by the connector), so that an idle database still moves the
    connector's position and the slot (docs/running.md "Source stalled"); the job's `sources[].heartbeat_table`
    names the same table."""
    return {
        "heartbeat.interval.ms": str(interval_ms),
        "heartbeat.action.query": f"insert into {table} (id, ts) values (1, now()) "
                                  "on conflict (id) do update set ts = excluded.ts",
    }


def heartbeat_table_ddl(table: str) -> str:
    return f"create table if not exists {table} (id int primary key, ts timestamptz not null)"


def mariadb_connector_config(
    name: str,
    source: MariaDbSource,
    topic_prefix: str,
    databases: list[str],
    *,
    registry_url: str,
    kafka_bootstrap: str,
    server_id: int,
    framing: str = "id4",
    id_type: str = "contentId",
) -> dict[str, str]:
    """A Debezium MariaDB connector (binlog) capturing `databases` into `<topic_prefix>.<database>.<table>`.

    `server_id` must differ from the server's and from every other binlog client's. The schema history (the
    DDL the connector replays on restart) is kept in the Kafka topic `<topic_prefix>.schema-history`.
    """
    return {
        "connector.class": "io.debezium.connector.mariadb.MariaDbConnector",
        "database.hostname": source.host,
        "database.port": str(source.port),
        "database.user": source.user,
        "database.password": source.password,
        "database.server.id": str(server_id),
        "topic.prefix": topic_prefix,
        "database.include.list": ",".join(databases),
        "schema.history.internal.kafka.bootstrap.servers": kafka_bootstrap,
        "schema.history.internal.kafka.topic": f"{topic_prefix}.schema-history",
        "include.schema.changes": "false",
        "schema.name.adjustment.mode": "avro",
        "snapshot.mode": "initial",
        "poll.interval.ms": str(POLL_INTERVAL_MS),
        **converter_config(registry_url, framing, id_type),
        **defaults_smt_config(),
    }


# What the unwrap SMT must add for the job to order a connector's flattened events (docs/sources.md
# "Unwrap-SMT events").
UNWRAP_POSITION_FIELDS: dict[str, str] = {
    "postgresql": "lsn",
    "mariadb": "file,pos,row",
    "mysql": "file,pos,row",
    "sqlserver": "commit_lsn,change_lsn,event_serial_no",
}


def unwrap_smt_config(connector: str, handling: str = "rewrite") -> dict[str, str]:
    """Debezium's unwrap SMT (ExtractNewRecordState) as the reference connectors set it: deletes rewritten to
    rows with `__deleted` (`handling`: rewrite or rewrite-with-tombstone), and `add.fields` carrying the op, the
    connector's source position and the source time; followed by the project's DefaultsAsParameters."""
    return {
        **defaults_smt_config("unwrap"),
        "transforms.unwrap.type": "io.debezium.transforms.ExtractNewRecordState",
        "transforms.unwrap.delete.tombstone.handling.mode": handling,
        "transforms.unwrap.add.fields": f"op,{UNWRAP_POSITION_FIELDS[connector]},source.ts_ms",
    }


HTTP_CONFLICT = 409
CONFLICT_RETRY_S = 30.0


class ConnectClient:
    """Minimal Kafka Connect REST client."""

    def __init__(self, url: str, timeout_s: float = 10.0) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s

    def _send(self, method: str, path: str, **kwargs: Any) -> requests.Response:
        """One REST call; a 409 is asked again for up to CONFLICT_RETRY_S. A distributed worker answers 409 while
        another connector's config change or a rebalance is in flight ("Cannot complete request momentarily due to
        stale configuration"): the tests create and delete connectors from several workers at once."""
        deadline = time.monotonic() + CONFLICT_RETRY_S
        while True:
            r = requests.request(method, f"{self.url}{path}", timeout=self.timeout_s, **kwargs)
            if r.status_code != HTTP_CONFLICT or time.monotonic() > deadline:
                return r
            time.sleep(0.5)

    def put_connector(self, name: str, config: dict[str, str]) -> None:
        """Create or update a connector (PUT /connectors/{name}/config is idempotent)."""
        r = self._send("PUT", f"/connectors/{name}/config", json=config)
        if r.status_code >= 300:
            raise RuntimeError(f"Kafka Connect rejected connector {name}: HTTP {r.status_code} {r.text[:500]}")

    def create_fresh(self, name: str, config: dict[str, str]) -> None:
        """Create a connector that starts from scratch (a new snapshot), even if Connect remembers offsets
        from an earlier connector of the same name: create it STOPPED (KIP-980), clear its offsets, resume."""
        self.delete_connector(name, reset_offsets=True)
        body = {"name": name, "config": config, "initial_state": "STOPPED"}
        r = self._send("POST", "/connectors", json=body)
        if r.status_code >= 300:
            raise RuntimeError(f"Kafka Connect rejected connector {name}: HTTP {r.status_code} {r.text[:500]}")
        self._wait_state(name, "STOPPED")
        self._delete_offsets(name)
        self._send("PUT", f"/connectors/{name}/resume").raise_for_status()

    def _wait_state(self, name: str, state: str, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                if self.status(name).get("connector", {}).get("state") == state:
                    return
            except requests.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"connector {name} not {state} after {timeout_s}s")
            time.sleep(0.5)

    def status(self, name: str) -> dict[str, Any]:
        r = requests.get(f"{self.url}/connectors/{name}/status", timeout=self.timeout_s)
        r.raise_for_status()
        return dict(r.json())

    def wait_running(self, name: str, timeout_s: float = 60.0) -> None:
        """Wait until the connector and its task run; a FAILED task raises with its trace."""
        deadline = time.monotonic() + timeout_s
        last: dict[str, Any] = {}
        while time.monotonic() < deadline:
            try:
                last = self.status(name)
            except requests.HTTPError:
                time.sleep(0.5)
                continue
            tasks = last.get("tasks", [])
            failed = [t for t in tasks if t.get("state") == "FAILED"]
            if failed:
                raise RuntimeError(f"connector {name} task failed: {failed[0].get('trace', '')[:2000]}")
            if last.get("connector", {}).get("state") == "RUNNING" and tasks and all(
                t.get("state") == "RUNNING" for t in tasks
            ):
                return
            time.sleep(0.5)
        raise TimeoutError(f"connector {name} not RUNNING after {timeout_s}s: {last}")

    def reset_offsets(self, name: str) -> None:
        """Stop a connector and delete its stored source offsets (KIP-875, Connect 3.6+): on `resume` it starts
        as new, a Debezium connector with `snapshot.mode=initial` snapshotting its tables again."""
        self._send("PUT", f"/connectors/{name}/stop").raise_for_status()
        self._wait_state(name, "STOPPED")
        self._delete_offsets(name)

    def _delete_offsets(self, name: str) -> None:
        r = self._send("DELETE", f"/connectors/{name}/offsets")
        if r.status_code >= 300:
            raise RuntimeError(f"cannot reset offsets of {name}: HTTP {r.status_code} {r.text[:500]}")

    def resume(self, name: str) -> None:
        """Run a stopped or paused connector again, and wait until it runs."""
        self._send("PUT", f"/connectors/{name}/resume").raise_for_status()
        self.wait_running(name)

    def delete_connector(self, name: str, reset_offsets: bool = False) -> None:
        """Delete a connector; with reset_offsets also its stored source offsets (KIP-875, Connect 3.6+).

        Connect keeps a deleted connector's offsets: a new connector of the same name would resume from them,
        which fails once its replication slot is gone. Resetting needs the connector STOPPED first.
        """
        if reset_offsets and requests.get(f"{self.url}/connectors/{name}", timeout=self.timeout_s).ok:
            self.reset_offsets(name)
        r = self._send("DELETE", f"/connectors/{name}")
        if r.status_code not in (204, 404):
            r.raise_for_status()
