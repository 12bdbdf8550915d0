"""scripts/verify.py's pure parts: the SQL that reads a source column in its Silver type, and the comparison of
both sides' hashes (chispa on small DataFrames)."""
from __future__ import annotations

from decimal import Decimal

from chispa import assert_df_equality
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    DataType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from app.config import parse_config
from scripts.verify import (
    KEY,
    RAW_PREFIX,
    SourceColumn,
    SourceLogin,
    SourceTable,
    TableReport,
    _reads,
    compare,
    hashed,
    maria_expression,
    merged_shards,
    source_expression,
)


def test_each_source_type_is_read_as_its_silver_type_or_named_not_compared() -> None:
    assert source_expression(SourceColumn("id", "int4", "N"), IntegerType()) == '"id"::text'
    stamp = source_expression(SourceColumn("at", "timestamptz", "D"), TimestampType())
    assert stamp is not None and "(\"at\" at time zone 'UTC')" in stamp and "'+00:00'" in stamp
    assert "'infinity'" in stamp
    # the output form: a char(n)'s padding kept, an inet without its /32
    assert source_expression(SourceColumn("c", "bpchar", "S"), StringType()) == \
        'case when "c" is null then null else format(\'%s\', "c") end'
    assert source_expression(SourceColumn("m", "money", "N"), DecimalType(38, 2)) == '"m"::numeric::text'
    assert source_expression(SourceColumn("t", "time", "D"), StringType()) == "to_char(\"t\", 'HH24:MI:SS.US')"
    assert source_expression(SourceColumn("b", "bytea", "U"), BinaryType()) == '"b"'
    arrays = source_expression(SourceColumn("a", "_timestamptz", "A", "timestamptz", "D"), ArrayType(TimestampType()))
    assert arrays is not None and "unnest(\"a\") with ordinality" in arrays and "order by u.n" in arrays
    # Mappings the script does not rebuild: named, never compared as if equal.
    assert source_expression(SourceColumn("i", "interval", "T"), StringType()) is None
    assert source_expression(SourceColumn("h", "hstore", "U"), StringType()) is None
    assert source_expression(SourceColumn("a", "_interval", "A", "interval", "T"), ArrayType(StringType())) is None
    assert source_expression(SourceColumn('we"ird', "text", "S"), StringType()) == \
        'case when "we""ird" is null then null else format(\'%s\', "we""ird") end'


def test_each_mariadb_type_is_read_as_its_silver_type_or_named_not_compared() -> None:
    assert maria_expression(SourceColumn("id", "int"), IntegerType()) == "cast(`id` as char)"
    assert maria_expression(SourceColumn("d", "decimal"), DecimalType(10, 2)) == "cast(`d` as char)"
    assert maria_expression(SourceColumn("d", "decimal"), DoubleType()) == "cast(`d` as double)"  # mode=double
    assert maria_expression(SourceColumn("f", "float"), FloatType()) == "cast(`f` as double)"  # widened exactly
    stamp = maria_expression(SourceColumn("at", "timestamp"), TimestampType())
    assert stamp == "concat(date_format(`at`, '%Y-%m-%d %H:%i:%s.%f'), '+00:00')"  # the session's zone: UTC
    assert maria_expression(SourceColumn("b", "bit", length=5), StringType()) == "lpad(bin(`b` + 0), 5, '0')"
    assert maria_expression(SourceColumn("b", "bit", length=1), BooleanType()) == "cast(`b` + 0 as char)"
    assert maria_expression(SourceColumn("raw", "blob"), BinaryType()) == "`raw`"
    assert maria_expression(SourceColumn("e", "enum"), StringType()) == "cast(`e` as char)"
    assert maria_expression(SourceColumn("j", "json"), StringType()) == "`j`"
    assert maria_expression(SourceColumn("t", "time"), StringType()) is None  # an elapsed time: not rebuilt
    assert maria_expression(SourceColumn("g", "point"), StructType([])) is None


SCHEMA = StructType([StructField("id", IntegerType()), StructField("name", StringType()),
                     StructField("amount", DecimalType(10, 2)), StructField("ratio", DoubleType()),
                     StructField("tags", ArrayType(StringType()))])
TYPES: dict[str, DataType] = {f.name: f.dataType for f in SCHEMA.fields}


def test_keys_on_one_side_and_values_that_differ_are_found_by_column(spark: SparkSession) -> None:
    source = spark.createDataFrame([
        (1, "a", Decimal("1.50"), float("nan"), ["x", None]),  # equal, NaN and a NULL element included
        (2, "b", Decimal("2.00"), 1.0, None),  # name differs
        (3, None, Decimal("3.00"), 2.0, []),  # NULL against a value: differs
        (4, "d", Decimal("4.00"), 3.0, ["y"]),  # missing from Silver
        (6, None, None, None, None),  # NULLs on both sides: equal
    ], SCHEMA)
    silver = spark.createDataFrame([
        (1, "a", Decimal("1.50"), float("nan"), ["x", None]),
        (2, "B", Decimal("2.00"), 1.0, None),
        (3, "", Decimal("3.01"), 2.0, []),
        (5, "e", Decimal("5.00"), 4.0, None),  # only in Silver
        (6, None, None, None, None),
    ], SCHEMA)
    found = compare(hashed(source, ["id"], TYPES), hashed(silver, ["id"], TYPES), ["name", "amount", "ratio", "tags"])
    expected = spark.createDataFrame([
        ('{"id":"2"}', "differing", ["name"]),
        ('{"id":"3"}', "differing", ["name", "amount"]),
        ('{"id":"4"}', "missing", []),
        ('{"id":"5"}', "extra", []),
    ], f"{KEY} string, kind string, columns array<string>")
    actual = found.select(KEY, "kind", F.when(F.col("kind") == "differing", F.col("columns"))
                          .otherwise(F.array().cast("array<string>")).alias("columns"))
    assert_df_equality(actual, expected, ignore_row_order=True, ignore_nullable=True)


def test_a_side_that_moves_changes_its_row_hash(spark: SparkSession) -> None:
    before = hashed(spark.createDataFrame([(1, "a", None, None, None)], SCHEMA), ["id"], TYPES)
    after = hashed(spark.createDataFrame([(1, "b", None, None, None)], SCHEMA), ["id"], TYPES)
    same = hashed(spark.createDataFrame([(1, "a", None, None, None)], SCHEMA), ["id"], TYPES)
    rows = [df.select("_verify_row").first()[0] for df in (before, after, same)]  # type: ignore[index]
    assert rows[0] != rows[1] and rows[0] == rows[2]


def test_a_source_value_that_does_not_cast_differs_from_null(spark: SparkSession) -> None:
    """A NaN numeric(p,s) reads as text Spark's cast to decimal makes NULL, where the connector sent NULL: the
    source's text (its RAW_PREFIX column) keeps them apart."""
    types: dict[str, DataType] = {"id": IntegerType(), "amount": DecimalType(10, 2)}
    source = spark.createDataFrame([(1, "NaN"), (2, None), (3, "1.50")], "id string, raw string").select(
        F.col("id").cast("int").alias("id"), F.col("raw").cast("decimal(10,2)").alias("amount"),
        F.col("raw").alias(f"{RAW_PREFIX}amount"))
    silver = spark.createDataFrame([(1, None), (2, None), (3, Decimal("1.50"))], "id int, amount decimal(10,2)")
    found = compare(hashed(source, ["id"], types), hashed(silver, ["id"], types), ["amount"])
    assert [(r[KEY], r["kind"], list(r["columns"])) for r in found.collect()] == [('{"id":"1"}', "differing",
                                                                                   ["amount"])]


def test_a_merged_table_is_read_from_every_shard_the_config_declares_with_its_discriminator() -> None:
    def shard(value: str) -> dict[str, object]:
        return {"name": "orders", "discriminator": {"column": "region", "value": value}}

    config = parse_config({
        "kafka": {"bootstrap_servers": "127.0.0.1:9092", "topic_pattern": r".*"},
        "registry": {"url": "http://127.0.0.1:8080"},
        "lake": {"bronze_path": "/l/b", "silver_path": "/l/s", "checkpoint_path": "/l/c", "database": "shop"},
        "sources": [
            {"name": "eu", "topic_prefix": "eu", "connector": "postgresql", "tables": {"shop.orders": shard("eu")}},
            {"name": "us", "topic_prefix": "us", "connector": "mariadb",
             "tables": {"shop.orders": shard("us"), "shop.users": {}}},
        ],
    })
    shards = merged_shards(config, "shop.orders")
    assert [(r.source, r.source_key, r.discriminator and r.discriminator.value) for r in shards] == [
        ("eu", "shop.orders", "eu"), ("us", "shop.orders", "us")]
    assert merged_shards(config, "shop.shop_users") == []

    pg, maria = SourceLogin("jdbc:postgresql://h/db", "u", ""), SourceLogin("jdbc:mariadb://h/", "u", "")
    columns = {"id": SourceColumn("id", "int4", "N"), "note": SourceColumn("note", "text", "S"),
               "span": SourceColumn("span", "interval", "T")}
    tables = [SourceTable("eu", pg, "shop", "orders", columns, ("region", "eu")),
              SourceTable("us", maria, "shop", "orders", {"id": SourceColumn("id", "int")}, ("region", "us"))]
    silver: dict[str, DataType] = {"id": IntegerType(), "note": StringType(), "span": StringType(),
                                   "region": StringType()}
    report = TableReport("shop.orders", "merged")
    reads = _reads(tables, silver, report)
    # a column one shard lacks is named, not compared; the discriminator is the job's constant, never read
    assert report.not_compared == {"note": "not in every merged table (none in us:shop.orders)",
                                   "span": "not in every merged table (none in us:shop.orders)"}
    assert [(r.table, list(r.expressions), r.constant) for r in reads] == [
        ("orders", ["id"], ("region", "eu")), ("orders", ["id"], ("region", "us"))]
    assert reads[1].expressions["id"] == "cast(`id` as char)"  # each shard in its own database's SQL
