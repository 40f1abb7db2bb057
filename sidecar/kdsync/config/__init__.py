"""The sidecar's configuration: a YAML file, validated into frozen pydantic models.

``load_config(path)`` reads and checks a file and raises ``ConfigError`` listing every
problem found, each as the field's path in YAML form (``members[1].kafka.bootstrapServers``),
what is wrong and how to fix it. Keys are camelCase in YAML; the models also accept the
snake_case field names when built from Python.

Problems are reported together: field checks, and the rules that relate several fields
(member names unique, ``member`` is one of ``members``, TLS unless insecure, ...), which
also run on the raw data when some field is invalid. A section's own cross-field rule
(e.g. ``electionTicks`` against ``heartbeatTicks``) runs once that section's fields are
valid, so fixing one problem may reveal another there.

TLS files are checked for existence and readability while validating. Code that builds a
model for files that live elsewhere (e.g. an operator rendering a config for a pod) passes
``check_files=False`` to ``parse_config`` or ``context={"check_files": False}`` to
``SidecarConfig.model_validate``.

The package, one concept per module (each imports only those above it):

- ``problems``: ``ConfigProblem``, ``ConfigError`` and YAML paths;
- ``sections``: the models of ``members[]``, ``topics``, ``tls``, ``admin``, ``ordering``
  and ``groupOffsetSync``;
- ``group_rules``: the rules that relate several fields (the members as a group);
- ``sidecar_config``: ``SidecarConfig``, the whole file;
- ``pydantic_errors``: pydantic's errors reworded as problems;
- ``loading``: ``parse_config`` and ``load_config``.

Import the public names from ``kdsync.config`` itself; the module layout may change.
"""

from kdsync.config.group_rules import MemberFacts
from kdsync.config.loading import load_config, parse_config
from kdsync.config.problems import ConfigError, ConfigProblem, Loc, format_path
from kdsync.config.pydantic_errors import problems_from_validation_error
from kdsync.config.sections import (
    OWNED_KAFKA_PROPERTIES,
    AdminConfig,
    GroupOffsetSyncConfig,
    KafkaConfig,
    MemberConfig,
    OrderingConfig,
    TlsConfig,
    TopicsConfig,
)
from kdsync.config.sidecar_config import SidecarConfig

__all__ = [
    "OWNED_KAFKA_PROPERTIES",
    "AdminConfig",
    "ConfigError",
    "ConfigProblem",
    "GroupOffsetSyncConfig",
    "KafkaConfig",
    "Loc",
    "MemberConfig",
    "MemberFacts",
    "OrderingConfig",
    "SidecarConfig",
    "TlsConfig",
    "TopicsConfig",
    "format_path",
    "load_config",
    "parse_config",
    "problems_from_validation_error",
]
