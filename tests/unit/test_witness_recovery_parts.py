"""A restarted witness recovers a log larger than one message, part by part.

Each answer is bounded in bytes like every other peer message (a frame holds 64 MiB); a
member whose log after its commit index is longer answers in parts, and the witness asks
for each next part after the last entry it got. If the member's log is overwritten in
between, the next part no longer continues what the witness holds, and that member's
answer starts again from its commit index: the witness never splices two logs.
"""

from __future__ import annotations

import pytest

from kdsync.ordering.log import Entry, ReplicatedLog
from kdsync.ordering.messages import RecoverReply, RecoverRequest
from kdsync.ordering.witness import RecoveredWitness, WitnessRecovery, recover_reply
from kdsync.wire_format.messages import decode_message, encode_message
from tests.simulation.mutants import RECOVERY_MUTANTS
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


def _recover_across_an_overwrite(
    recovery: WitnessRecovery,
) -> tuple[RecoveredWitness, ReplicatedLog]:
    """A first part of three entries; then a new leader of term 3 overwrites the member's
    log from index 7 and commits up to 6, and the member answers the next request."""
    before = _log([(i, 1) for i in range(1, 21)], commit=5)
    ((peer, first_request),) = recovery.requests(TERM)
    entry = before.entry(6).batch
    assert entry is not None
    first = _answer(before, 5, first_request, max_bytes=3 * entry.size_bytes())
    assert first.more and [e.index for e in first.entries] == [6, 7, 8]
    follow_up = recovery.reply(peer, first, TERM)
    assert isinstance(follow_up, RecoverRequest)
    assert (follow_up.after_index, follow_up.after_term) == (8, 1)
    after = _log([(i, 1 if i < 7 else 3) for i in range(1, 13)], commit=6)
    second = _answer(after, 6, follow_up, max_bytes=1 << 20)
    assert (second.prev_index, second.prev_term) == (6, 1), "starts again at its commit"
    recovered = recovery.reply(peer, second, TERM)
    assert isinstance(recovered, RecoveredWitness)
    return recovered, after


def test_a_log_overwritten_between_parts_is_fetched_again_not_spliced() -> None:
    recovered, member = _recover_across_an_overwrite(WitnessRecovery(("a",), NONCE, "w"))
    assert (recovered.commit_index, recovered.commit_term) == (6, 1)
    assert list(recovered.entries) == member.slice(7, 12)
    assert all(e.term == 3 for e in recovered.entries)


@pytest.mark.parametrize("name", sorted(RECOVERY_MUTANTS))
def test_the_planted_splice_is_caught(name: str) -> None:
    """The broken variant ends with a log no member holds: entries 6-8 of term 1, then
    term 3's from 7 on, after them."""
    broken = RECOVERY_MUTANTS[name](("a",), NONCE, "w")
    recovered, member = _recover_across_an_overwrite(broken)
    held = member.slice(recovered.commit_index + 1, member.last_index)
    assert list(recovered.entries) != held


def test_an_answer_to_no_request_out_is_ignored() -> None:
    """An answer echoes its request's nonce: one to a request this witness never sent
    (or sent before it restarted) continues nothing it asked for."""
    log = _log([(i, 1) for i in range(1, 11)], commit=2)
    earlier_start = WitnessRecovery(("a",), NONCE, "w")
    ((_, request_before_restart),) = earlier_start.requests(TERM)
    recovery = WitnessRecovery(("a",), NONCE + 1, "w")
    ((_, request),) = recovery.requests(TERM)
    assert request.nonce != request_before_restart.nonce
    late = _answer(log, 2, request_before_restart, max_bytes=1 << 20)
    assert recovery.reply("a", late, TERM) is None
    stray = _answer(log, 2, RecoverRequest(TERM, request.nonce + 1, 6, 1), max_bytes=1 << 20)
    assert stray.prev_index == 6
    assert recovery.reply("a", stray, TERM) is None
    # What it asked for still counts.
    answer = _answer(log, 2, request, max_bytes=1 << 20)
    recovered = recovery.reply("a", answer, TERM)
    assert isinstance(recovered, RecoveredWitness)
    assert list(recovered.entries) == log.slice(3, 10)


def test_a_re_ask_keeps_answers_that_took_parts_and_refreshes_whole_ones() -> None:
    long_log = _log([(i, 1) for i in range(1, 11)], commit=2)
    short_log = _log([(i, 1) for i in range(1, 4)], commit=3)
    recovery = WitnessRecovery(("a", "b", "c"), NONCE, "w")
    bound = 1  # one entry per part
    asked = dict(recovery.requests(TERM))
    assert recovery.reply("a", _answer(short_log, 3, asked["a"], bound), TERM) is None
    request: RecoverRequest | RecoveredWitness | None = asked["b"]
    while isinstance(request, RecoverRequest):
        request = recovery.reply("b", _answer(long_log, 2, request, bound), TERM)
    assert request is None  # c has not answered
    # The re-ask (c's answer was lost): a's one-message answer is asked for again, fresher;
    # b's eight-part answer is asked for afresh too but kept meanwhile, so a large answer
    # need not fit in one re-ask period (and a kept one is still replaced in time).
    again = dict(recovery.requests(TERM))
    assert sorted(again) == ["a", "b", "c"]
    assert again["c"] == asked["c"], "the request still out to c is repeated, not replaced"
    assert again["b"].after_index == 0, "b's answer is asked for from its start"
    assert recovery.reply("a", _answer(short_log, 3, again["a"], bound), TERM) is None
    recovered = recovery.reply("c", _answer(short_log, 3, asked["c"], bound), TERM)
    assert isinstance(recovered, RecoveredWitness)
    assert list(recovered.entries) == long_log.slice(3, 10)


def test_an_answer_delivered_twice_counts_once() -> None:
    """The copy asks for nothing: two requests out to one member would be two chains."""
    log = _log([(i, 1) for i in range(1, 11)], commit=2)
    recovery = WitnessRecovery(("a",), NONCE, "w")
    ((_, request),) = recovery.requests(TERM)
    answer = _answer(log, 2, request, max_bytes=1)
    assert answer.more
    follow_up = recovery.reply("a", answer, TERM)
    assert isinstance(follow_up, RecoverRequest)
    assert (follow_up.after_index, follow_up.after_term) == (3, 1)
    assert recovery.reply("a", answer, TERM) is None


def _window(commit: int) -> ReplicatedLog:
    """A member that keeps nothing at or below ``commit - 1`` in memory, and five
    entries after its commit index."""
    log = ReplicatedLog()
    after = range(commit + 1, commit + 6)
    log.reset(commit, 1, [Entry(i, 1, batch(10 * i, 10 * i + 10, origin=f"o{i}")) for i in after])
    return log


def test_answers_that_all_start_afresh_keep_one_request_out() -> None:
    """The group commits faster than the witness takes parts (one entry each), and the
    entry a request continues after has always left the member's memory: every answer
    starts afresh from the member's commit index. With every frame delivered twice and a
    re-ask every ten rounds, one request stays out; before requests had nonces of their
    own, each copy of a fresh start was taken and the requests out doubled every round
    (simulator seed 6017355)."""
    recovery = WitnessRecovery(("a",), NONCE, "w")
    in_flight = [request for _, request in recovery.requests(TERM)]
    commit = 10
    for round_ in range(1, 61):
        if round_ % 10 == 0:
            in_flight += [request for _, request in recovery.requests(TERM)]
        answered, in_flight = in_flight, []
        commit += 2
        member = _window(commit)
        for request in answered:
            answer = _answer(member, commit, request, max_bytes=1)
            assert answer.prev_index == commit and answer.more
            for copy in (answer, answer):
                outcome = recovery.reply("a", copy, TERM)
                if isinstance(outcome, RecoverRequest):
                    in_flight.append(outcome)
        assert len(in_flight) == 1, f"round {round_}: {len(in_flight)} requests out"


def test_a_whole_answer_that_arrives_after_a_re_ask_still_counts() -> None:
    """On a link slower than the re-ask period, a one-message answer arrives after the
    re-ask that forgot the previous one and asked again: it counts (it was given after
    this start and starts no chain), or such a member would never count as answered."""
    log = _log([(i, 1) for i in range(1, 6)], commit=2)
    recovery = WitnessRecovery(("a", "b"), NONCE, "w")
    first = dict(recovery.requests(TERM))
    assert recovery.reply("a", _answer(log, 2, first["a"], 1 << 20), TERM) is None
    # b's answer is slow: the re-ask forgets a's and asks both again.
    again = dict(recovery.requests(TERM))
    assert again["a"].nonce != first["a"].nonce
    late_from_b = _answer(log, 2, first["b"], 1 << 20)
    assert recovery.reply("b", late_from_b, TERM) is None, "a has not answered since"
    # a's answer to the first request, delivered twice and late, counts once.
    late_from_a = _answer(log, 2, first["a"], 1 << 20)
    recovered = recovery.reply("a", late_from_a, TERM)
    assert isinstance(recovered, RecoveredWitness)
    assert list(recovered.entries) == log.slice(3, 5)


def test_a_late_part_of_an_earlier_chain_is_dropped() -> None:
    """A part that is not whole counts only as the answer to the request out: one of an
    earlier request would start a second chain."""
    log = _log([(i, 1) for i in range(1, 11)], commit=2)
    recovery = WitnessRecovery(("a",), NONCE, "w")
    ((_, first),) = recovery.requests(TERM)
    follow_up = recovery.reply("a", _answer(log, 2, first, max_bytes=1), TERM)
    assert isinstance(follow_up, RecoverRequest)
    assert recovery.reply("a", _answer(log, 2, first, max_bytes=1), TERM) is None
