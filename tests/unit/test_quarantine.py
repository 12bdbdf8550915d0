"""app/sink/quarantine.py `failure_kind`: which failures of a table's unit quarantine it, which are tried again."""
from __future__ import annotations

from app.errors import EnvelopeError, SinkWriteError, SourceSettingError
from app.sink.quarantine import failure_kind


class JavaError(Exception):
    """Stands in for the text of a Py4JJavaError: the JVM's message, its "Caused by:" lines and stack frames."""


def _sink_error(java_text: str) -> SinkWriteError:
    try:
        raise JavaError(java_text)
    except JavaError as e:
        error = SinkWriteError("batch 3: Hudi write of db.t failed")
        error.__cause__ = e
        return error


SCHEMA_REFUSED = (
    "An error occurred while calling o812.save.\n"
    ": org.apache.hudi.exception.SchemaBackwardsCompatibilityException: Schema validation backwards compatibility "
    "check failed with the following issues: {MISSING_UNION_BRANCH: reader union lacking writer type: FIXED}\n"
    "\tat org.apache.hudi.avro.AvroSchemaUtils.checkSchemaCompatible(AvroSchemaUtils.java:424)\n"
)
S3_DOWN = (
    "An error occurred while calling o90.save.\n: org.apache.hudi.exception.HoodieIOException: Failed to create\n"
    "\tat org.apache.hudi.storage.HoodieStorage.create(HoodieStorage.java:10)\n"
    "Caused by: java.net.ConnectException: Connection refused\n"
)
THROTTLED = ": com.amazonaws.services.s3.model.AmazonS3Exception: Slow Down (Service: Amazon S3; Status Code: 503)"


def test_refused_schemas_and_unplannable_events_quarantine() -> None:
    assert failure_kind(_sink_error(SCHEMA_REFUSED)) == "quarantine"
    assert failure_kind(EnvelopeError("t: writer schema contentId:4: an unwrap-SMT event without __deleted")) == (
        "quarantine")


def test_outages_are_transient_even_with_a_quarantining_message() -> None:
    assert failure_kind(_sink_error(S3_DOWN)) == "transient"
    assert failure_kind(_sink_error(THROTTLED)) == "transient"
    assert failure_kind(_sink_error(SCHEMA_REFUSED + "Caused by: java.net.SocketTimeoutException: Read timed out")) == (
        "transient")


def test_config_contradictions_and_other_errors_fail_the_batch() -> None:
    assert failure_kind(SourceSettingError("t: ... says connector: mariadb; fix that setting")) == "other"
    assert failure_kind(_sink_error(": org.apache.hudi.exception.HoodieKeyException: recordKey value is null")) == (
        "other")
    # Only what was thrown counts, not the frames it passed through.
    frames = ": java.lang.IllegalStateException: boom\n\tat org.apache.thrift.transport.TTransportException.x(X.java:1)"
    assert failure_kind(_sink_error(frames)) == "other"
