"""The job config: one typed, validated YAML file per environment.

`model` holds the sections (frozen dataclasses), `load` reads a file (local or on S3) and builds and checks them,
`partitions` parses a table's `partition_by`. Imports nothing of the job but app/errors.py.
"""
from app.config.load import COLLECTOR_FLAG, collectors_named, load_config, parse_config, read_config_text
from app.config.model import (
    AUTH_FIELDS,
    ConnectorName,
    DeadLetterConfig,
    DeleteMode,
    DiscriminatorConfig,
    FramingMode,
    IdType,
    JobConfig,
    KafkaConfig,
    LakeConfig,
    MetastoreConfig,
    RecoveryConfig,
    RegistryAuthConfig,
    RegistryConfig,
    SourceCatalogConfig,
    SourceConfig,
    SparkConfig,
    TableConfig,
    TableType,
    TriggerConfig,
)
from app.config.partitions import PartitionSpec

__all__ = [
    "AUTH_FIELDS", "COLLECTOR_FLAG", "ConnectorName", "DeadLetterConfig", "DeleteMode", "DiscriminatorConfig",
    "FramingMode", "IdType", "JobConfig", "KafkaConfig", "LakeConfig", "MetastoreConfig", "PartitionSpec",
    "RecoveryConfig", "RegistryAuthConfig", "RegistryConfig", "SourceCatalogConfig", "SourceConfig", "SparkConfig",
    "TableConfig", "TableType", "TriggerConfig", "collectors_named", "load_config", "parse_config", "read_config_text",
]
