"""Errors the Kafka shells raise, each with a message an operator can act on."""

from __future__ import annotations


class KafkaShellError(Exception):
    """Base class: something about a member's Kafka cluster stops the sidecar."""


class KafkaUnavailable(KafkaShellError):
    """The cluster did not answer in time (wrong address, brokers down, auth refused)."""


class KafkaAuthenticationFailed(KafkaUnavailable):
    """The brokers refused the sidecar's login (SASL) or TLS handshake: retrying with the
    same settings cannot help, and nothing was read or written."""


class ProducerFenced(KafkaShellError):
    """Another sidecar instance with the same transactional id took over this member."""


class CommitOutcomeUnknown(KafkaShellError):
    """A transaction's commit was sent but its outcome could not be learned in time: the
    records may or may not be in ``T-global``. Writing them again could duplicate them,
    so the member stops; a restart's ``init_transactions`` settles the transaction with
    the coordinator, and the ledger read back says what was committed."""


class RecordTooLarge(KafkaShellError):
    """A record exceeds what the destination topic accepts (``max.message.bytes``)."""

    def __init__(self, topic: str, size: int, detail: str) -> None:
        self.topic = topic
        self.size = size
        super().__init__(
            f"a record of about {size} bytes for {topic} was refused as too large ({detail}); "
            f"delivery is halted, nothing is skipped. Fix: raise max.message.bytes on {topic} "
            "(kafka-configs --alter --entity-type topics --entity-name "
            f"{topic} --add-config max.message.bytes=<bytes>); delivery resumes by itself"
        )


class GlobalTopicLost(KafkaShellError):
    """``T-global`` holds fewer records than this member has committed to it: the topic was
    deleted (and perhaps recreated). Writing on would leave a hole at its start."""

    def __init__(self, topic: str, detail: str) -> None:
        self.topic = topic
        super().__init__(
            f"{topic} {detail}. Delivery to it is halted so that no hole is written over; the "
            "ordering log, the ledger and the source topics are untouched, and the other "
            f"members go on. Fix: restore {topic} (e.g. copy it from another member's "
            "T-global, which holds the same records in the same order), or see "
            "docs/operations.md on a lost T-global; delivery resumes by itself once the "
            "topic holds at least what the ledger says"
        )


class BackfillPending(KafkaShellError):
    """A backfill began seeding this member's cluster and has not written its ledger: its
    ``T-global`` is half copied, and a sidecar started now would write over it."""

    def __init__(self, member: str) -> None:
        super().__init__(
            f"{member}'s cluster is being seeded by a backfill (kdsync members add) that has "
            "not finished: its ledger is not written yet, so this sidecar does not start. "
            f"Fix: run `kdsync members add {member} ... --member-config ...` again and start "
            f"the sidecar when it says so; to give up, `kdsync members remove {member}`"
        )


class InvalidClientProperties(KafkaShellError):
    """librdkafka refuses a property of ``kafka.properties`` (unknown name or bad value)."""
