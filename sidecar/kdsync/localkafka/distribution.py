"""Where the Kafka broker classpath lives, as provisioned by ``hack/fetch-kafka``.

``hack/fetch-kafka`` copies the runtime jars of ``kafka_2.13`` (pinned in
``hack/kafka/pom.xml``) into ``$KDSYNC_CACHE/kafka/<version>/libs`` and writes a log4j2
config next to that folder. This module finds that folder and builds ``java`` commands
that run classes from it.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

# Must match <kafka.version> in hack/kafka/pom.xml (a unit test checks it).
KAFKA_VERSION = "4.3.1"

LIBS_ENV = "KDSYNC_KAFKA_LIBS"
CACHE_ENV = "KDSYNC_CACHE"
JAVA_HOME_ENV = "JAVA_HOME"

_FETCH_HINT = "run hack/fetch-kafka (it downloads the pinned Kafka jars from Maven Central)"


class KafkaNotProvisioned(RuntimeError):
    """The Kafka jars (or a Java runtime to run them) are not on this machine."""


def cache_dir(environ: Mapping[str, str] | None = None) -> Path:
    """The kdsync download cache, the same folder ``hack/common.sh`` uses."""
    env = os.environ if environ is None else environ
    configured = env.get(CACHE_ENV)
    if configured:
        return Path(configured)
    return Path(env.get("HOME", str(Path.home()))) / ".cache" / "kdsync"


def default_libs_dir(environ: Mapping[str, str] | None = None) -> Path:
    """The libs folder to use: ``$KDSYNC_KAFKA_LIBS`` if set, else the cache layout."""
    env = os.environ if environ is None else environ
    configured = env.get(LIBS_ENV)
    if configured:
        return Path(configured)
    return cache_dir(env) / "kafka" / KAFKA_VERSION / "libs"


@dataclass(frozen=True)
class KafkaDistribution:
    """A runnable Kafka classpath plus the ``java`` that runs it."""

    libs_dir: Path
    java: Path
    # None when the libs came from somewhere without our log4j2 config: the broker then
    # logs only log4j2's default (errors to the console).
    log4j_config: Path | None

    @property
    def classpath(self) -> str:
        # A wildcard entry, expanded by the JVM itself (not by a shell).
        return str(self.libs_dir / "*")

    def java_command(
        self,
        main_class: str,
        args: Sequence[str] = (),
        jvm_options: Sequence[str] = (),
    ) -> list[str]:
        """The argv that runs ``main_class`` from this classpath."""
        command = [str(self.java), *jvm_options]
        if self.log4j_config is not None:
            command.append(f"-Dlog4j2.configurationFile={self.log4j_config}")
        command += ["-cp", self.classpath, main_class, *args]
        return command


def find_java(environ: Mapping[str, str] | None = None) -> Path:
    """``$JAVA_HOME/bin/java`` if set, else ``java`` on PATH."""
    env = os.environ if environ is None else environ
    java_home = env.get(JAVA_HOME_ENV)
    if java_home:
        candidate = Path(java_home) / "bin" / "java"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    found = shutil.which("java", path=env.get("PATH"))
    if found is None:
        raise KafkaNotProvisioned(
            "no `java` found (JAVA_HOME unset or invalid, none on PATH); "
            f"Kafka {KAFKA_VERSION} needs Java 17 or newer"
        )
    return Path(found)


def find_distribution(
    libs_dir: Path | None = None, environ: Mapping[str, str] | None = None
) -> KafkaDistribution:
    """Locate the provisioned Kafka classpath or raise :class:`KafkaNotProvisioned`."""
    libs = libs_dir if libs_dir is not None else default_libs_dir(environ)
    if not libs.is_dir():
        raise KafkaNotProvisioned(
            f"Kafka {KAFKA_VERSION} jars not found: {libs} does not exist; {_FETCH_HINT}"
        )
    if not any(libs.glob("kafka_2.13-*.jar")):
        raise KafkaNotProvisioned(
            f"{libs} holds no kafka_2.13-*.jar (an interrupted download?); {_FETCH_HINT}"
        )
    log4j_config = libs.parent / "log4j2.xml"
    return KafkaDistribution(
        libs_dir=libs,
        java=find_java(environ),
        log4j_config=log4j_config if log4j_config.is_file() else None,
    )
