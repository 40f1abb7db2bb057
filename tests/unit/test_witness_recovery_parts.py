"""A restarted witness recovers a log larger than one message, part by part.

Each answer is bounded in bytes like every other peer message (a frame holds 64 MiB); a
member whose log after its commit index is longer answers in parts, and the witness asks
for each next part after the last entry it got. If the member's log is overwritten in
between, the next part no longer continues what the witness holds, and that member's
answer starts again from its commit index: the witness never splices two logs.
"""

from __future__ import annotations

from kdsync.ordering.log import Entry, ReplicatedLog
from kdsync.ordering.messages import RecoverReply, RecoverRequest
from kdsync.ordering.witness import RecoveredWitness, WitnessRecovery, recover_reply
from kdsync.wire_format.messages import decode_message, encode_message
from tests.unit.test_ledger import batch

NONCE = 7
TERM = 5
EVENT_BYTES = 100


def _log(entries: list[tuple[int, int]], commit: int) -> ReplicatedLog:
    """A log of (index, term) entries from 1 on, each a batch of ten 100-byte events."""
    log = ReplicatedLog()
    for index, term in entries:
        events = range(10 * index, 10 * index + 10)
        log.append(Entry(index, term, batch(events.start, events.stop, origin=f"o{index}")))
    assert log.term_at(commit) is not None
    return log


def _answer(
    log: ReplicatedLog, commit: int, request: RecoverRequest, max_bytes: int
) -> RecoverReply:
    reply = recover_reply(TERM, log, commit, request, max_bytes, None)
    # Every part crosses the wire as it is: it must survive the codec unchanged.
    decoded = decode_message(encode_message(reply))
    assert decoded == reply
    assert isinstance(decoded, RecoverReply)
    return decoded


def _recover(
    recovery: WitnessRecovery, logs: dict[str, tuple[ReplicatedLog, int]], max_bytes: int
) -> tuple[RecoveredWitness, dict[str, list[RecoverReply]]]:
    """Runs the exchange to its end, delivering every message at once and in order."""
    sent: dict[str, list[RecoverReply]] = {peer: [] for peer in logs}
    pending = recovery.requests(TERM)
    while pending:
        peer, request = pending.pop(0)
        log, commit = logs[peer]
        reply = _answer(log, commit, request, max_bytes)
        sent[peer].append(reply)
        outcome = recovery.reply(peer, reply, TERM)
        if isinstance(outcome, RecoverRequest):
            pending.append((peer, outcome))
        elif isinstance(outcome, RecoveredWitness):
            return outcome, sent
    raise AssertionError("the recovery never concluded")


def test_a_long_log_arrives_in_bounded_parts_and_whole() -> None:
    leader = _log([(i, 1 if i <= 20 else 2) for i in range(1, 61)], commit=10)
    follower = _log([(i, 1) for i in range(1, 31)], commit=10)
    one_entry = leader.entry(11).batch
    assert one_entry is not None
    entry_bytes = one_entry.size_bytes()
    bound = 4 * entry_bytes + entry_bytes // 2  # four entries per part
    recovered, sent = _recover(
        WitnessRecovery(("a", "b"), NONCE, "w"), {"a": (leader, 10), "b": (follower, 10)}, bound
    )
    # The most up-to-date log (term 2 at the end), after its commit index, entry for entry.
    assert (recovered.commit_index, recovered.commit_term) == (10, 1)
    assert list(recovered.entries) == leader.slice(11, 60)
    parts = sent["a"]
    assert len(parts) == 13  # 50 entries, four per part
    assert [p.more for p in parts] == [True] * 12 + [False]
    assert all(sum(e.batch.size_bytes() for e in p.entries if e.batch) <= bound for p in parts)


def test_an_entry_larger_than_the_bound_still_travels_alone() -> None:
    log = _log([(i, 1) for i in range(1, 6)], commit=1)
    recovered, sent = _recover(WitnessRecovery(("a",), NONCE, "w"), {"a": (log, 1)}, max_bytes=1)
    assert [len(p.entries) for p in sent["a"]] == [1, 1, 1, 1]
    assert list(recovered.entries) == log.slice(2, 5)


def test_a_log_overwritten_between_parts_is_fetched_again_not_spliced() -> None:
    before = _log([(i, 1) for i in range(1, 21)], commit=5)
    recovery = WitnessRecovery(("a",), NONCE, "w")
    ((peer, first_request),) = recovery.requests(TERM)
    entry = before.entry(6).batch
    assert entry is not None
    first = _answer(before, 5, first_request, max_bytes=3 * entry.size_bytes())
    assert first.more and [e.index for e in first.entries] == [6, 7, 8]
    follow_up = recovery.reply(peer, first, TERM)
    assert isinstance(follow_up, RecoverRequest)
    assert (follow_up.after_index, follow_up.after_term) == (8, 1)
    # Meanwhile a new leader of term 3 overwrote the member's log from index 7 and
    # committed up to 6.
    after = _log([(i, 1 if i < 7 else 3) for i in range(1, 13)], commit=6)
    second = _answer(after, 6, follow_up, max_bytes=1 << 20)
    assert (second.prev_index, second.prev_term) == (6, 1), "starts again at its commit"
    recovered = recovery.reply(peer, second, TERM)
    assert isinstance(recovered, RecoveredWitness)
    assert (recovered.commit_index, recovered.commit_term) == (6, 1)
    assert list(recovered.entries) == after.slice(7, 12)
    assert all(e.term == 3 for e in recovered.entries)


def test_a_part_that_continues_nothing_held_is_ignored() -> None:
    log = _log([(i, 1) for i in range(1, 11)], commit=2)
    recovery = WitnessRecovery(("a",), NONCE, "w")
    stray = _answer(log, 2, RecoverRequest(TERM, NONCE, 6, 1), max_bytes=1 << 20)
    assert stray.prev_index == 6
    assert recovery.reply("a", stray, TERM) is None
    assert recovery.requests(TERM) == [("a", RecoverRequest(TERM, NONCE))]


def test_a_re_ask_keeps_answers_that_took_parts_and_refreshes_whole_ones() -> None:
    long_log = _log([(i, 1) for i in range(1, 11)], commit=2)
    short_log = _log([(i, 1) for i in range(1, 4)], commit=3)
    recovery = WitnessRecovery(("a", "b", "c"), NONCE, "w")
    bound = 1  # one entry per part
    whole = _answer(short_log, 3, RecoverRequest(TERM, NONCE), bound)
    assert recovery.reply("a", whole, TERM) is None
    request: RecoverRequest | RecoveredWitness | None = RecoverRequest(TERM, NONCE)
    while isinstance(request, RecoverRequest):
        request = recovery.reply("b", _answer(long_log, 2, request, bound), TERM)
    assert request is None  # c has not answered
    # The re-ask (c's answer was lost): a's one-message answer is asked for again, fresher;
    # b's eight-part answer is asked for afresh too but kept meanwhile, so a large answer
    # need not fit in one re-ask period (and a kept one is still replaced in time).
    assert sorted(peer for peer, _ in recovery.requests(TERM)) == ["a", "b", "c"]
    assert recovery.reply("a", whole, TERM) is None
    recovered = recovery.reply("c", whole, TERM)
    assert isinstance(recovered, RecoveredWitness)
    assert list(recovered.entries) == long_log.slice(3, 10)
