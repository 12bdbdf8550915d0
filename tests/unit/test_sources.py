"""Several sources in one job (app/config/model.py `sources`) and the topic -> Silver table rule
(app/routing/route.py): each
source's tables in its own catalog database, SQL Server's three-part topics, and two topics never sharing a
Silver table, whichever way their names collide."""
from __future__ import annotations

from typing import Any

import pytest
from pyspark.sql import SparkSession

from app.config import DiscriminatorConfig, JobConfig, TableConfig, parse_config
from app.errors import ConfigError, EnvelopeError
from app.routing.route import (
    TableRoute,
    check_owner,
    check_routes,
    claim_routes,
    claim_tables,
    route_topic,
    skip_reason,
)
from app.wire.source import subscribe_pattern

LAKE = {"database": "lake", "silver_path": "/l/silver", "bronze_path": "/l/bronze", "checkpoint_path": "/l/cp"}


def _config(sources: Any = None, **top: Any) -> JobConfig:
    raw: dict[str, Any] = {
        "kafka": {"bootstrap_servers": "127.0.0.1:9092", "topic_pattern": r".*"},
        "registry": {"url": "http://127.0.0.1:8080"},
        "lake": LAKE,
        **top,
    }
    if sources is not None:
        raw["sources"] = sources
    return parse_config(raw)


TICKIT = [
    {"name": "crm", "topic_prefix": "crm", "connector": "postgresql", "database": "crm",
     "tables": {"public.users": {"record_key": ["userid"]}}},
    {"topic_prefix": "ecomm", "connector": "mariadb", "framing": "headers", "database": "ecomm"},
    {"name": "erp", "topic_prefix": "erp", "connector": "sqlserver",
     "tables": {"erp.dbo.orders": {"name": "orders"}}},
]


def test_each_source_routes_its_topics_to_its_own_database() -> None:
    config = _config(TICKIT)

    crm = route_topic("crm.public.users", config)
    ecomm = route_topic("ecomm.shop.listing", config)
    erp = route_topic("erp.erp.dbo.orders", config)
    erp_other = route_topic("erp.erp.sales.lines", config)

    assert (crm.qualified_name, crm.record_key, crm.source, crm.connector) == (
        "crm.public_users", ("userid",), "crm", "postgresql")
    assert (ecomm.qualified_name, ecomm.source, ecomm.connector) == ("ecomm.shop_listing", "ecomm", "mariadb")
    assert (erp.qualified_name, erp.source_key, erp.source_schema, erp.source_table) == (
        "lake.orders", "erp.dbo.orders", "dbo", "orders")
    assert (erp_other.qualified_name, erp_other.source_database) == ("lake.erp_sales_lines", "erp")
    assert config.databases == ["crm", "ecomm", "lake"]
    assert config.lake.table_path(crm.table, crm.database) == "/l/silver/crm/public_users"


def test_sql_server_topics_have_three_parts_and_others_two() -> None:
    config = _config(TICKIT)
    with pytest.raises(EnvelopeError, match=r"is not 'erp\.<database>\.<schema>\.<table>' \(source erp\)"):
        route_topic("erp.dbo.orders", config)
    with pytest.raises(EnvelopeError, match=r"is not 'crm\.<schema>\.<table>' \(source crm\)"):
        route_topic("crm.db.public.users", config)


def test_the_longest_prefix_owns_a_topic() -> None:
    config = _config([{"topic_prefix": "cdc"}, {"topic_prefix": "cdc.eu", "database": "eu"}])
    assert route_topic("cdc.eu.public.users", config).qualified_name == "eu.public_users"
    assert route_topic("cdc.public.users", config).qualified_name == "lake.public_users"


def test_one_source_form_and_sources_list_are_the_same_job() -> None:
    one = _config(source={"topic_prefix": "crm"}, tables={"public.users": {"name": "users"}})
    listed = _config([{"topic_prefix": "crm", "tables": {"public.users": {"name": "users"}}}])
    assert one.source_list == listed.source_list
    assert one.source_list[0].table_config("public", "users") == TableConfig(name="users")


def test_names_that_collide_within_a_source_are_refused_with_the_fix() -> None:
    config = _config([{"topic_prefix": "crm"}])
    with pytest.raises(ConfigError) as e:
        check_routes(config, ["crm.a_b.c", "crm.a.b_c", "crm.x.y"])
    assert e.value.key == 'sources[0].tables."a_b.c".name'
    assert "topics 'crm.a.b_c' and 'crm.a_b.c' both map to Silver table lake.a_b_c" in str(e.value)

    fixed = _config([{"topic_prefix": "crm", "tables": {"a_b.c": {"name": "a_b__c"}}}])
    routes = check_routes(fixed, ["crm.a_b.c", "crm.a.b_c", "crm.x.y", "unrelated.topic"])
    assert sorted(r.qualified_name for r in routes) == ["lake.a_b__c", "lake.a_b_c", "lake.x_y"]


def test_two_sources_with_the_same_table_collide_only_in_one_database() -> None:
    same = _config([{"topic_prefix": "pg"}, {"topic_prefix": "maria"}])
    with pytest.raises(ConfigError, match=r"'maria\.shop\.users' and 'pg\.shop\.users' both map to .*lake\.shop_users"):
        check_routes(same, ["pg.shop.users", "maria.shop.users"])

    apart = _config([{"topic_prefix": "pg"}, {"topic_prefix": "maria", "database": "maria"}])
    assert len(check_routes(apart, ["pg.shop.users", "maria.shop.users"])) == 2


def test_a_table_holding_another_topics_offsets_refuses_a_second_topic() -> None:
    """Across batches: `crm.a.b_c` wrote `lake.a_b_c` earlier; `crm.a_b.c` appears later and maps there too."""
    config = _config([{"topic_prefix": "crm"}])
    late = route_topic("crm.a_b.c", config)
    check_owner(late, [], config)  # a new table
    check_owner(late, ["crm.a_b.c"], config)  # its own
    with pytest.raises(EnvelopeError) as e:
        check_owner(late, ["crm.a.b_c", "crm.a_b.c"], config)
    assert "its commits hold the offsets of crm.a.b_c" in str(e.value)
    assert 'sources[0].tables."a_b.c".name' in str(e.value)


def test_a_table_recording_its_source_table_refuses_another_and_takes_its_partitions() -> None:
    """Commits record the source table they hold: a colliding name is refused even after the first topic's
    offsets, and the partitions of the recorded partitioned table pass, including topics detached since."""
    config = _config([{"topic_prefix": "crm"}])
    roots = {"crm": {("s", "pay_1"): ("s", "pay"), ("s", "pay_2"): ("s", "pay")}}
    pay = route_topic("crm.s.pay", config, roots)
    part = route_topic("crm.s.pay_2", config, roots)
    assert pay.source_identity == part.source_identity == "crm:s.pay"

    check_owner(part, ["crm.s.pay", "crm.s.pay_1", "crm.s.pay_old"], config, "crm:s.pay")
    late = route_topic("crm.a_b.c", config)
    with pytest.raises(EnvelopeError) as e:
        check_owner(late, ["crm.a.b_c"], config, "crm:a.b_c")
    assert "it holds the rows of crm:a.b_c, this topic is crm:a_b.c" in str(e.value)
    assert 'sources[0].tables."a_b.c".name' in str(e.value)


def test_a_topic_appearing_later_is_refused_the_table_another_holds_and_the_others_go_on() -> None:
    """A running job (app/batch/planner.py): the routes found at start claim their tables; a topic that appears
    later and maps to one of them is refused, naming the setting, while new tables of their own are claimed."""
    config = _config([{"topic_prefix": "crm"}])
    claims: dict[str, TableRoute | None] = {}
    assert claim_tables([route_topic("crm.a.b_c", config), route_topic("crm.x.y", config)], claims, config) == {}
    assert sorted(claims) == ["lake.a_b_c", "lake.x_y"]

    later = [route_topic(t, config) for t in ("crm.a.b_c", "crm.a_b.c", "crm.x.y", "crm.new.t")]
    refused = claim_tables(later, claims, config)
    assert list(refused) == ["crm.a_b.c"]
    assert "topics 'crm.a.b_c' and 'crm.a_b.c' both map to Silver table lake.a_b_c" in refused["crm.a_b.c"]
    assert "crm.a.b_c holds the table" in refused["crm.a_b.c"]
    assert refused["crm.a_b.c"].endswith('(sources[0].tables."a_b.c".name)')
    held = claims["lake.a_b_c"]
    assert held is not None and held.topic == "crm.a.b_c" and "lake.new_t" in claims
    assert claim_tables([route_topic("crm.a_b.c", config)], claims, config).keys() == {"crm.a_b.c"}  # every batch


def test_two_topics_appearing_together_for_a_new_table_are_both_refused() -> None:
    config = _config([{"topic_prefix": "crm"}])
    claims: dict[str, TableRoute | None] = {}
    refused = claim_tables([route_topic("crm.a.b_c", config), route_topic("crm.a_b.c", config),
                            route_topic("crm.x.y", config)], claims, config)
    assert sorted(refused) == ["crm.a.b_c", "crm.a_b.c"]
    assert all("none of them is written until they are told apart" in why for why in refused.values())
    assert claims["lake.a_b_c"] is None and claims["lake.x_y"] is not None
    # Either one alone in a later batch is refused too: it would miss the records refused before.
    later = claim_tables([route_topic("crm.a.b_c", config)], claims, config)
    assert list(later) == ["crm.a.b_c"] and later["crm.a.b_c"].endswith('(sources[0].tables."a.b_c".name)')


def test_at_start_the_topic_holding_a_contested_table_keeps_it() -> None:
    """`claim_routes` with the tables' holders (app/state/stale.py `table_holder`): the topic whose offsets the
    table's commits hold keeps it and the other is refused; a contested table nobody holds stops the start."""
    config = _config([{"topic_prefix": "crm"}])
    topics = ["crm.a_b.c", "crm.a.b_c", "crm.x.y"]
    asked: list[list[str]] = []

    def holder(routes: list[TableRoute]) -> TableRoute | None:
        asked.append([r.topic for r in routes])
        return next(r for r in routes if r.topic == "crm.a_b.c")

    routes, refused = claim_routes(config, topics, None, holder)
    assert asked == [["crm.a.b_c", "crm.a_b.c"]]  # the contested table only
    assert sorted(r.topic for r in routes) == ["crm.a_b.c", "crm.x.y"]
    assert list(refused) == ["crm.a.b_c"] and "crm.a_b.c holds the table" in refused["crm.a.b_c"]
    with pytest.raises(ConfigError, match=r"both map to Silver table lake\.a_b_c"):
        claim_routes(config, topics, None, lambda routes: None)


def test_shards_and_partitions_share_a_claimed_table() -> None:
    config = _config([{"topic_prefix": "crm"}])
    roots = {"crm": {("s", "pay_1"): ("s", "pay"), ("s", "pay_2"): ("s", "pay")}}
    claims: dict[str, TableRoute | None] = {}
    assert claim_tables([route_topic("crm.s.pay", config, roots)], claims, config) == {}
    assert claim_tables([route_topic(t, config, roots) for t in ("crm.s.pay_1", "crm.s.pay_2")], claims, config) == {}
    assert list(claims) == ["lake.s_pay"]
    # Declared shards share theirs; a topic not declared one is refused it.
    shards = _config([  # c.s.v's own name is s_v too
        {"topic_prefix": "a", "tables": {"s.t": {"name": "s_v", "discriminator": {"column": "db", "value": "a"}}}},
        {"topic_prefix": "b", "tables": {"s.u": {"name": "s_v", "discriminator": {"column": "db", "value": "b"}}}},
        {"topic_prefix": "c"},
    ])
    claims = {}
    assert claim_tables([route_topic("a.s.t", shards)], claims, shards) == {}
    refused = claim_tables([route_topic(t, shards) for t in ("b.s.u", "c.s.v")], claims, shards)
    assert list(refused) == ["c.s.v"] and "a.s.t holds the table" in refused["c.s.v"]


def test_the_single_source_form_names_its_top_level_tables_key() -> None:
    config = _config(source={"topic_prefix": "crm"})
    with pytest.raises(ConfigError) as e:
        check_routes(config, ["crm.a_b.c", "crm.a.b_c"])
    assert e.value.key == 'tables."a_b.c".name'


@pytest.mark.parametrize(("top", "sources", "key"), [
    ({}, None, "sources"),  # neither
    ({"source": {"topic_prefix": "a"}}, [{"topic_prefix": "b"}], "sources"),  # both
    ({"tables": {"s.t": {"name": "t"}}}, [{"topic_prefix": "b"}], "tables"),
    ({}, [{"topic_prefix": "a"}, {"topic_prefix": "a", "name": "other"}], "sources[1].topic_prefix"),
    ({}, [{"topic_prefix": "a"}, {"topic_prefix": "b", "name": "a"}], "sources[1].name"),
    ({}, [{"topic_prefix": "a."}], "sources[0].topic_prefix"),
    ({}, [{"topic_prefix": "a", "database": "no-dash"}], "sources[0].database"),
    ({}, [{"topic_prefix": "a", "connector": "oracle"}], "sources[0].connector"),
    ({}, [{"topic_prefix": "a", "tables": {"t": {}}}], "sources[0].tables.t"),
    # one Silver name for two source tables: a merge, refused without a discriminator on each (or unique keys)
    ({}, [{"topic_prefix": "a", "tables": {"s.t": {"name": "x"}}},
          {"topic_prefix": "b", "tables": {"s.u": {"name": "x"}}}], "sources[1].tables.s.u.discriminator"),
    ({}, [{"topic_prefix": "a", "tables": {"s.t": {"name": "x", "discriminator": {"column": "db", "value": "a"}}}},
          {"topic_prefix": "b", "tables": {"s.u": {"name": "x"}}}], "sources[1].tables.s.u.discriminator"),
    ({}, [{"topic_prefix": "a", "tables": {"s.t": {"name": "x", "unique_keys": True}}},
          {"topic_prefix": "b", "tables": {"s.u": {"name": "x"}}}], "sources[1].tables.s.u.discriminator"),
    ({}, [{"topic_prefix": "a", "tables": {"s.t": {"name": "x", "discriminator": {"column": "db", "value": "a"}}}},
          {"topic_prefix": "b", "tables": {"s.u": {"name": "x", "discriminator": {"column": "src", "value": "b"}}}}],
     "sources[1].tables.s.u.discriminator.column"),
    ({}, [{"topic_prefix": "a", "tables": {"s.t": {"name": "x", "discriminator": {"column": "db", "value": "a"}}}},
          {"topic_prefix": "b", "tables": {"s.u": {"name": "x", "discriminator": {"column": "db", "value": "a"}}}}],
     "sources[1].tables.s.u.discriminator.value"),
    ({}, [{"topic_prefix": "a", "tables": {"s.t": {"discriminator": {"column": "db", "value": "a"}}}}],
     "sources[0].tables.s.t.discriminator"),
    ({}, [{"topic_prefix": "a", "tables": {"s.t": {"name": "x", "discriminator": {"column": "no-dash"}}}}],
     "sources[0].tables.s.t.discriminator.column"),
    ({}, [{"topic_prefix": "a", "connector": "mariadb",
           "catalog": {"jdbc_url": "jdbc:postgresql://h/db", "user": "u", "password_env": "HOME"}}],
     "sources[0].catalog"),
    ({}, [{"topic_prefix": "a", "catalog": {"jdbc_url": "postgresql://h/db", "user": "u", "password_env": "HOME"}}],
     "sources[0].catalog.jdbc_url"),
    ({}, [{"topic_prefix": "a", "catalog": {"jdbc_url": "jdbc:postgresql://h/db", "user": "u",
                                            "password_env": "CDC_NOT_SET_ANYWHERE"}}],
     "sources[0].catalog.password_env"),
])
def test_bad_sources_are_refused_naming_the_key(top: dict[str, Any], sources: Any, key: str) -> None:
    with pytest.raises(ConfigError) as e:
        _config(sources, **top)
    assert e.value.key == key


SHARDS = [
    {"name": "east", "topic_prefix": "east", "tables": {
        "shop.orders": {"name": "orders", "discriminator": {"column": "shard", "value": "east"}}}},
    {"name": "west", "topic_prefix": "west", "tables": {
        "shop.orders": {"name": "orders", "discriminator": {"column": "shard", "value": "west"}}}},
    {"name": "tenants", "topic_prefix": "tn", "tables": {
        "t1.users": {"name": "users", "unique_keys": True}, "t2.users": {"name": "users", "unique_keys": True}}},
]


def test_declared_shards_share_one_table_and_others_still_collide() -> None:
    config = _config(SHARDS)

    routes = check_routes(config, ["east.shop.orders", "west.shop.orders", "tn.t1.users", "tn.t2.users"])

    assert [(r.topic, r.qualified_name, r.merged) for r in routes] == [
        ("east.shop.orders", "lake.orders", True), ("tn.t1.users", "lake.users", True),
        ("tn.t2.users", "lake.users", True), ("west.shop.orders", "lake.orders", True),
    ]
    assert route_topic("west.shop.orders", config).discriminator == DiscriminatorConfig("shard", "west")
    # an undeclared topic whose derived name is a merged table's is still refused
    collide = _config([{"name": "tenants", "topic_prefix": "tn", "tables": {
        "t1.users": {"name": "x_users", "unique_keys": True}, "t2.users": {"name": "x_users", "unique_keys": True}}},
        {"name": "other", "topic_prefix": "other"}])
    with pytest.raises(ConfigError) as e:
        check_routes(collide, ["tn.t1.users", "other.x.users"])
    assert e.value.key == 'sources[1].tables."x.users".name'


def test_partitions_found_in_the_catalog_route_to_their_partitioned_table() -> None:
    config = _config([{"name": "pg", "topic_prefix": "pg", "tables": {
        "public.payment": {"name": "payments", "partition_by": "month(paid_at)"}}}])
    roots = {"pg": {("public", "payment_p2024_01"): ("public", "payment"),
                    ("public", "payment_p2024_02"): ("public", "payment")}}

    routes = check_routes(config, ["pg.public.payment", "pg.public.payment_p2024_01", "pg.public.payment_p2024_02",
                                   "pg.public.payment_old"], roots)

    by_topic = {r.topic: r for r in routes}
    assert {r.qualified_name for t, r in by_topic.items() if t != "pg.public.payment_old"} == {"lake.payments"}
    part = by_topic["pg.public.payment_p2024_01"]
    assert (part.source_key, part.source_partition, part.partition) == (
        "public.payment", "public.payment_p2024_01", by_topic["pg.public.payment"].partition)
    # not in the catalog (e.g. detached): a table of its own, whatever its name looks like
    assert by_topic["pg.public.payment_old"].qualified_name == "lake.public_payment_old"
    # without the catalog's word, a partition's topic is a table of its own
    assert route_topic("pg.public.payment_p2024_01", config).qualified_name == "lake.public_payment_p2024_01"
    # roots of another source do not apply
    assert route_topic("pg.public.payment_p2024_01", config, {"other": roots["pg"]}).source_partition is None


def test_the_topic_pattern_is_matched_against_the_whole_topic_name(spark: SparkSession) -> None:
    """Spark's subscribePattern finds its regex anywhere in a name (Scala's Regex.findFirstIn, i.e. Java's
    Matcher.find): the job anchors kafka.topic_pattern, so a topic that merely contains a match is not read."""
    jvm = spark.sparkContext._jvm
    assert jvm is not None

    def subscribed(pattern: str, topic: str) -> bool:
        return bool(jvm.java.util.regex.Pattern.compile(pattern).matcher(topic).find())

    pattern = r"td1\.[^.]+\.[^.]+"
    assert subscribed(pattern, "ptd1.ptd_1.debezium_signal")  # what Spark alone would do
    assert not subscribed(subscribe_pattern(pattern), "ptd1.ptd_1.debezium_signal")
    assert not subscribed(subscribe_pattern(pattern), "td1.a.b.c")
    assert subscribed(subscribe_pattern(pattern), "td1.a.b")
    assert subscribed(subscribe_pattern("a|b"), "b") and not subscribed(subscribe_pattern("a|b"), "ab")


def test_debezium_topics_without_table_rows_are_skipped_with_why() -> None:
    config = _config(TICKIT)
    topics = ["crm.transaction", "__debezium-heartbeat.ecomm", "ecomm", "crm.public.users", "erp.erp.dbo.orders"]

    reasons = {t: skip_reason(t, config) for t in topics}
    routed = [r.topic for r in check_routes(config, topics)]

    assert reasons == {
        "crm.transaction": "the transaction metadata topic of source crm (provide.transaction.metadata)",
        "__debezium-heartbeat.ecomm": "the heartbeat topic of source ecomm (heartbeat.interval.ms)",
        "ecomm": "the schema change topic of source ecomm (DDL events, no table rows)",
        "crm.public.users": None,
        "erp.erp.dbo.orders": None,
    }
    assert routed == ["crm.public.users", "erp.erp.dbo.orders"]
    # a table's topic whose name merely ends the same way is a table's topic
    assert skip_reason("crm.transaction.events", config) is None
    assert skip_reason("__debezium-heartbeat.other", config) is None


def test_messages_name_a_table_setting_as_each_config_spells_it() -> None:
    """One rule for the key a message names (JobConfig.table_setting_key), right for a `sources` list (the n-th
    source's own tables), SQL Server's three-part table keys, and one `source` with top-level or its own tables."""
    config = _config(TICKIT)
    erp = route_topic("erp.erp.dbo.orders", config)
    ecomm = route_topic("ecomm.shop.listing", config)
    assert config.table_setting_key(erp.source, erp.source_key, "partition_by") == (
        'sources[2].tables."erp.dbo.orders".partition_by')
    assert config.table_setting_key(ecomm.source, ecomm.source_key, "record_key") == (
        'sources[1].tables."shop.listing".record_key')
    single = _config(source={"topic_prefix": "cdc"}, tables={"s.t": {"name": "x"}})
    route = route_topic("cdc.s.t", single)
    assert single.table_setting_key(route.source, route.source_key, "discriminator") == 'tables."s.t".discriminator'
    own = _config(source={"topic_prefix": "cdc", "tables": {"s.t": {"name": "x"}}})
    assert own.table_setting_key(route.source, route.source_key, "name") == 'source.tables."s.t".name'
