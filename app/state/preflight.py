"""Start-up checks: before the job reads data, it asks each service it needs one question, so a wrong setting
ends the job at once naming its key (exit 2), and an outage is waited out (app/recovery.py) instead of failing the
first batch halfway.

    the lake and checkpoint paths   the bucket (or folder) of each answers: a missing bucket or refused
                                    credentials is the path's key
    the registry                    its API answers at `registry.url` (app/wire/registry.py `check`)
    the metastore                   the job's database can be looked up: a wrong database or user in
                                    `metastore.*`
    the broker                      the topics can be listed (app/state/resume.py): an unresolvable
                                    `kafka.bootstrap_servers`, or credentials the broker refuses (`kafka.options`)

A refusal or a timeout (connection refused, `UNREACHABLE` in app/recovery.py) is an outage: the error goes up as
it is, and the job waits and checks again.
"""
from __future__ import annotations

import logging
import re
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Final, TypeVar

from py4j.protocol import Py4JError
from pyspark.sql import SparkSession
from pyspark.sql.utils import CapturedException

from app.config import JobConfig
from app.errors import ConfigError, java_root_cause
from app.recovery import error_text, unreachable
from app.sink.lakefs import fs_and_path
from app.wire.registry import RegistryClient

log = logging.getLogger(__name__)
T = TypeVar("T")

# Words of a wrong setting: (pattern, key, what to say); for the lake, (pattern, what to say) of any of its paths.
# Checked before the words of an outage, since a wrong setting can come wrapped in those (Hive's "Unable to open a
# test connection" around a wrong database).
LAKE_WORDS: Final = (
    (re.compile(r"NoSuchBucket|UnknownStoreException|[Bb]ucket .{0,80}does not exist"), "the bucket does not exist"),
    (re.compile(r"AccessDenied|Access Denied|403 Forbidden|InvalidAccessKeyId|SignatureDoesNotMatch|"
                r"NoAuthWithAWSException"), "access refused: check the credentials and the bucket's policy"),
)
METASTORE_WORDS: Final = (
    (re.compile(r'database "[^"]*" does not exist|Unknown database'), "metastore.jdbc_url",
     "the metastore's database does not exist"),
    (re.compile(r'role "[^"]*" does not exist'), "metastore.user", "the metastore has no such user"),
    (re.compile(r"password authentication failed|Access denied for user|no password was provided"),
     "metastore.password_env", "the metastore refused the user or password"),
)
BROKER_WORDS: Final = (
    (re.compile(r"No resolvable bootstrap urls|Invalid url in bootstrap\.servers"), "kafka.bootstrap_servers",
     "no broker address resolves"),
    (re.compile(r"(Sasl|Ssl)?AuthenticationException|TopicAuthorizationException|ClusterAuthorizationException"),
     "kafka.options", "the broker refused the job's credentials"),
)


def check_services(spark: SparkSession, config: JobConfig, registry: RegistryClient,
                   list_topics: Callable[[], T]) -> T:
    """The checks of the module docstring (the metastore's beside the others), the first that fails in that order
    raised; `list_topics` asks the broker (the start's own topic listing, so the check costs no second round), and
    its answer is returned.

    Raises:
        ConfigError: a setting is wrong; names its key.
        RegistryError, Py4JError, CapturedException: a service is out of reach (an outage: app/recovery.py).
    """
    # The session's catalog: `metastore.*`, or the cluster's own (EMR: Hive's or Glue's client). Its check is the
    # slowest, the catalog's client starting (seconds in a new JVM), so it runs beside the others; a failure is
    # raised in the checks' order all the same.
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="metastore-check") as pool:
        metastore = pool.submit(_checked, lambda: spark.catalog.databaseExists(config.lake.database),
                                "the metastore", METASTORE_WORDS)
        for key, path in (("lake.silver_path", config.lake.silver_path),
                          ("lake.bronze_path", config.lake.bronze_path),
                          ("lake.checkpoint_path", config.lake.checkpoint_path)):
            _check_path(spark, key, path)
        registry.check()
        try:
            return _checked(list_topics, "the broker", BROKER_WORDS)
        finally:  # the metastore's failure before the broker's, whatever that was
            metastore.result()


def _check_path(spark: SparkSession, key: str, path: str) -> None:
    """The path's file system answers for it (on S3: a HEAD and a one-key listing, which a missing bucket fails);
    the path itself need not exist yet."""
    def probe() -> None:
        fs, hadoop_path = fs_and_path(spark, path)
        fs.exists(hadoop_path)
    _checked(probe, path, tuple((words, key, f"{path}: {what}") for words, what in LAKE_WORDS))


def _checked(ask: Callable[[], T], what: str, wrong: tuple[tuple[re.Pattern[str], str, str], ...]) -> T:
    """`ask()`, with a failure whose words say a setting is wrong raised as ConfigError naming its key."""
    try:
        return ask()
    except (Py4JError, CapturedException) as e:
        text = error_text(e)
        for words, key, message in wrong:
            if words.search(text):
                raise ConfigError(key, f"{message} ({java_root_cause(e)[:300]})") from e
        if not unreachable(text):
            log.error("start-up check of %s failed: %s", what, java_root_cause(e))
        raise

