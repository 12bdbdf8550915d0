"""The class list of the drivers' class-data sharing archive (devkit/cds.py): what a class-loading log adds to it, and
the list as the archive's workload reads it. No JVM."""
from __future__ import annotations

from pathlib import Path

import pytest

from devkit import cds

LOG = """\
[0.089s][info][class,load] java.lang.Object source: shared objects file
[0.101s][info][class,load] org.apache.kafka.clients.admin.Admin source: file:/x/.deps/spark/kafka-clients-3.4.1.jar
[0.102s][info][class,load] org.apache.kafka.clients.admin.AdminClient source: file:/x/.deps/spark/kafka-clients.jar
[0.103s][info][class,load] javax.xml.parsers.DocumentBuilder source: jrt:/java.xml
[0.104s][info][class,load] org.apache.spark.sql.Foo$$Lambda$123/0x0000 source: org.apache.spark.sql.Foo
[0.105s][info][class,load] jdk.internal.reflect.GeneratedConstructorAccessor7 source: __JVM_DefineClass__
[0.106s][info][class,load] org.apache.spark.sql.catalyst.expressions.GeneratedClass$SpecificUnsafeProjection \
source: file:/x/janino.jar
[0.107s][info][class,load] org.apache.hudi.Bar source: shared objects file (top)
"""


def test_a_log_adds_the_classes_loaded_from_jars_and_modules_not_those_made_at_run_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    listed = tmp_path / "cds_classes.txt"
    listed.write_text("org.apache.kafka.clients.admin Admin\n")
    monkeypatch.setattr(cds, "CLASS_LIST", listed)
    log = tmp_path / "classes.log"
    log.write_text(LOG)
    assert cds.record(log) == 2  # AdminClient and DocumentBuilder; Admin was listed
    assert listed.read_text() == "javax.xml.parsers DocumentBuilder\norg.apache.kafka.clients.admin Admin AdminClient\n"
    assert cds.listed_classes(listed.read_text()) == [
        "javax.xml.parsers.DocumentBuilder", "org.apache.kafka.clients.admin.Admin",
        "org.apache.kafka.clients.admin.AdminClient"]
    assert cds.record(log) == 0


def test_the_shipped_list_names_classes_once_each() -> None:
    names = cds.listed_classes(cds.CLASS_LIST.read_text())
    assert len(names) > 1000 and len(names) == len(set(names))
    assert "org.apache.kafka.clients.consumer.KafkaConsumer" in names
