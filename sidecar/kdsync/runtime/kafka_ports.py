"""The driver's ports on real Kafka: blocking client calls run in worker threads, and
their completions come back to the driver on the event loop thread.

Only the event loop thread touches the driver; worker threads touch only the Kafka
clients they were handed.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import time
from collections.abc import Coroutine, Mapping, Sequence
from typing import Any

from kdsync.driver import MemberDriver, SourcePartition, WriteFailure
from kdsync.kafka.errors import (
    CommitOutcomeUnknown,
    GlobalTopicLost,
    KafkaShellError,
    ProducerFenced,
    RecordTooLarge,
)
from kdsync.kafka.global_writer import GlobalWriter
from kdsync.kafka.log_store import LogStore
from kdsync.kafka.source_reader import SourceReader
from kdsync.ordering import Delivery, Entry, HardState, LedgerState, OriginBatch
from kdsync.runtime.metrics import SidecarMetrics

log = logging.getLogger(__name__)


class _LoopPort:
    """Runs blocking calls in threads and keeps a reference to each task until done."""

    def __init__(self) -> None:
        self.driver: MemberDriver | None = None  # set once the driver exists
        self._tasks: set[asyncio.Task[None]] = set()

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _bound(self) -> MemberDriver:
        assert self.driver is not None, "port used before its driver was bound"
        return self.driver


class KafkaLogPort(_LoopPort):
    def __init__(self, store: LogStore, metrics: SidecarMetrics) -> None:
        super().__init__()
        self._store = store
        self._metrics = metrics
        self._trimming = False

    def persist(
        self, hard_state: HardState | None, entries: list[Entry], truncate_from: int | None
    ) -> None:
        self._spawn(self._persist(hard_state, entries, truncate_from))

    async def _persist(
        self, hard_state: HardState | None, entries: list[Entry], truncate_from: int | None
    ) -> None:
        try:
            await asyncio.to_thread(self._store.persist, hard_state, entries, truncate_from)
        except KafkaShellError as exc:
            self._bound().log_persist_failed(str(exc))
            return
        self._bound().log_persisted()

    def load(self, spans: list[tuple[int, int]], max_bytes: int) -> None:
        self._spawn(self._load(spans, max_bytes))

    async def _load(self, spans: list[tuple[int, int]], max_bytes: int) -> None:
        found: list[Entry] = []
        started = time.monotonic()
        try:
            for first, last in spans:  # each bounded on its own (LogPort.load)
                found.extend(await asyncio.to_thread(self._store.load, first, last, max_bytes))
        except KafkaShellError as exc:
            self._bound().load_failed(str(exc))
            return
        except Exception as exc:  # e.g. a record that does not decode
            # Reported and retried like a broker error: a read-back left pending for
            # good would stop this member applying once its log passed maxLogBytes.
            log.exception("reading the ordering log back failed")
            self._bound().load_failed(f"{type(exc).__name__}: {exc}")
            return
        self._metrics.log_readback_seconds.observe(time.monotonic() - started)
        self._metrics.log_readback_entries.inc(len(found))
        self._bound().entries_loaded(found)

    def trim(self, below_index: int) -> None:
        if not self._trimming:
            self._trimming = True
            self._spawn(self._trim(below_index))

    async def _trim(self, below_index: int) -> None:
        try:
            await asyncio.to_thread(self._store.trim, below_index)
        except KafkaShellError as exc:
            log.warning("trimming the ordering log failed (retried later): %s", exc)
        finally:
            self._trimming = False


class KafkaDeliveryPort(_LoopPort):
    def __init__(self, writer: GlobalWriter, metrics: SidecarMetrics) -> None:
        super().__init__()
        self._writer = writer
        self._metrics = metrics

    def write(self, deliveries: Sequence[Delivery], ledger: LedgerState) -> None:
        self._spawn(self._write(deliveries, ledger))

    async def _write(self, deliveries: Sequence[Delivery], ledger: LedgerState) -> None:
        driver = self._bound()
        try:
            result = await asyncio.to_thread(self._writer.write, deliveries, ledger)
        except RecordTooLarge as exc:
            driver.transaction_failed(WriteFailure.TOO_LARGE, str(exc))
        except GlobalTopicLost as exc:
            driver.transaction_failed(WriteFailure.GLOBAL_TOPIC_LOST, str(exc))
        except ProducerFenced as exc:
            driver.transaction_failed(WriteFailure.FENCED, str(exc))
        except CommitOutcomeUnknown as exc:
            driver.transaction_failed(WriteFailure.OUTCOME_UNKNOWN, str(exc))
        except KafkaShellError as exc:
            driver.transaction_failed(WriteFailure.UNAVAILABLE, str(exc))
        else:
            self._metrics.commit_seconds.observe(result.seconds)
            driver.transaction_committed()


class KafkaSourcePort:
    def __init__(self, reader: SourceReader) -> None:
        self._reader = reader

    def take(self) -> OriginBatch | None:
        try:
            return self._reader.batches.get_nowait()
        except queue.Empty:
            return None

    def commit(self, positions: Mapping[SourcePartition, int]) -> None:
        self._reader.commit(positions)
