"""The driver channel of continuous mode (`regional.runtime.channel`): framing round trips in
any chunking, the HMAC handshake, fencing of older attempts and of answers that are not the
round's, and the socket adapter on loopback (no Spark)."""

from __future__ import annotations

import socket
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metadata.model import SubtaskState
from regional.coordinator.messages import Ack, AckBatch, Decline, UnitWork
from regional.runtime.channel import (
    MAX_FRAME,
    Answers,
    ChannelClosed,
    ChannelError,
    ChannelServer,
    EpochRound,
    Fencing,
    FrameReader,
    Hello,
    Stop,
    TaskAttempt,
    TaskChannel,
    Work,
    admit,
    frame,
    hello_mac,
    new_token,
)

RUN = "run-1"

ints = st.integers(min_value=0, max_value=2**31)
units = st.lists(st.integers(min_value=0, max_value=5000), max_size=8, unique=True).map(tuple)
works = st.builds(
    lambda cid, us: [UnitWork(cid, 1, u, (SubtaskState("src", u, u),)) for u in us], ints, units
)
messages = st.one_of(
    st.builds(Stop, st.text(max_size=20), st.text(max_size=40)),
    st.builds(
        lambda cid, tid, ws: Work(RUN, cid, tid, tuple(w.unit_id for w in ws), ws),
        ints,
        ints,
        works,
    ),
    st.builds(
        lambda cid, tid, us: Answers(
            RUN,
            cid,
            tid,
            us,
            [AckBatch.of([Ack(cid, u, 1, ()) for u in us])] if us else [Decline(cid, 0, 1, "x")],
        ),
        ints,
        ints,
        units,
    ),
    st.builds(
        Hello,
        st.text(max_size=20),
        ints,
        ints,
        ints,
        st.binary(max_size=32),
        st.binary(max_size=32),
    ),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(messages, max_size=6), st.lists(st.integers(1, 64), min_size=1, max_size=20))
def test_frames_round_trip_in_any_chunking(sent, cuts):
    data = b"".join(frame(m) for m in sent)
    reader, got, at, i = FrameReader(), [], 0, 0
    while at < len(data):
        step = cuts[i % len(cuts)]
        got += reader.feed(data[at : at + step])
        at, i = at + step, i + 1
    assert got == sent
    assert reader.pending == 0


def test_a_frame_over_the_limit_or_not_a_message_is_refused():
    with pytest.raises(ChannelError, match="over the 16-byte limit"):
        FrameReader(limit=16).feed((17).to_bytes(4, "big") + b"x" * 17)
    with pytest.raises(ChannelError, match=r"over the .*-byte limit"):
        FrameReader().feed((MAX_FRAME + 1).to_bytes(4, "big"))
    with pytest.raises(ChannelError, match="not a channel message"):
        FrameReader().feed((3).to_bytes(4, "big") + b"abc")


def _hello(token, challenge, *, run=RUN, task=0, attempt=0, tid=5, nonce=b"n" * 32):
    return Hello(
        run, task, attempt, tid, nonce, hello_mac(token, challenge, run, task, attempt, tid, nonce)
    )


def test_admission_needs_the_token_this_run_and_a_task_of_the_job():
    token, challenge = new_token(), b"c" * 32
    assert admit(token, challenge, RUN, 2, _hello(token, challenge)) is None
    assert "bad HMAC" in admit(token, challenge, RUN, 2, _hello(new_token(), challenge))
    assert "bad HMAC" in admit(token, challenge, RUN, 2, _hello(token, b"d" * 32))  # replayed
    forged = _hello(token, challenge)
    forged = Hello(RUN, 1, 0, forged.task_attempt_id, forged.nonce, forged.mac)  # other task
    assert "bad HMAC" in admit(token, challenge, RUN, 2, forged)
    assert "not this driver's run" in admit(
        token, challenge, RUN, 2, _hello(token, challenge, run="other")
    )
    assert "not one of the job's 2 tasks" in admit(
        token, challenge, RUN, 2, _hello(token, challenge, task=2)
    )


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 50)), max_size=40))
def test_fencing_keeps_the_newest_attempt_of_every_task(hellos):
    f = Fencing()
    newest: dict[int, int] = {}
    for connection, (task, tid) in enumerate(hellos):
        admission = f.hello(TaskAttempt(task, 0, tid, connection))
        if task in newest and tid <= newest[task]:
            assert admission.refused is not None and f.live[task].task_attempt_id == newest[task]
        else:
            assert admission.refused is None
            assert admission.fenced is None or admission.fenced.task_attempt_id < tid
            newest[task] = tid
        assert {t: a.task_attempt_id for t, a in f.live.items()} == newest


def test_a_round_takes_only_its_own_answers_from_the_attempt_its_work_went_to():
    ws = [UnitWork(4, 1, u, ()) for u in (0, 1)]
    old, new = TaskAttempt(0, 0, 7, 1), TaskAttempt(0, 1, 9, 2)
    r = EpochRound(RUN, 4)
    r.sent(new, ws)
    acks = [AckBatch.of([Ack(4, 0, 1, ()), Ack(4, 1, 1, ())])]
    assert "no work of checkpoint 4 went to it" in r.take(Answers(RUN, 4, 7, (0, 1), acks), old)
    assert "sent answers tagged" in r.take(Answers(RUN, 4, 9, (0, 1), acks), old)
    assert "not 'run-1'" in r.take(Answers("other", 4, 9, (0, 1), acks), new)
    assert "of checkpoint 3, not 4" in r.take(Answers(RUN, 3, 9, (0, 1), acks), new)
    assert "other than those sent" in r.take(Answers(RUN, 4, 9, (0,), acks), new)
    wrong = [AckBatch.of([Ack(4, 5, 1, ())])]
    assert "other than those sent" in r.take(Answers(RUN, 4, 9, (0, 1), wrong), new)
    assert not r.lost_task(old)  # the fenced attempt had none of this round's work
    assert r.take(Answers(RUN, 4, 9, (0, 1), acks), new) is None
    assert r.done and r.arrived() == acks and r.lost_units == []
    assert "already answered" in r.take(Answers(RUN, 4, 9, (0, 1), acks), new)
    assert not r.lost_task(new)  # answered before it went


def test_a_lost_or_unsent_task_names_its_units():
    r = EpochRound(RUN, 4)
    t = TaskAttempt(1, 0, 3, 1)
    r.sent(t, [UnitWork(4, 1, 2, ()), UnitWork(4, 1, 3, ())])
    r.unsent(0, [0, 1], "task 0 of the long job is not connected")
    assert not r.done and r.waiting == [1]
    assert r.lost_task(t)
    assert r.done and r.lost_units == [0, 1, 2, 3]
    assert r.lost[0] == "task 0 of the long job is not connected (units 0, 1)"
    assert (
        r.lost[1] == "task 1 (Spark attempt 0, task attempt id 3) lost: connection dropped "
        "(units 2, 3)"
    )


# --- the socket adapter on loopback ---------------------------------------------------------


def _connect(server, token, task=0, attempt=0, tid=1):
    return TaskChannel.connect(server.address, token, RUN, task, attempt, tid, timeout=5)


def _wait(server, check, seconds=5.0):
    until = time.monotonic() + seconds
    with server.changed:
        while not check():
            assert time.monotonic() < until, "timed out"
            server.changed.wait(0.05)


def test_a_task_with_the_token_is_admitted_and_talks_both_ways():
    token = new_token()
    server = ChannelServer("127.0.0.1", token, RUN, 2)
    try:
        task = _connect(server, token, task=1, tid=4)
        _wait(server, lambda: 1 in server.fencing.live)
        attempt = server.fencing.live[1]
        ws = [UnitWork(2, 1, 9, ())]
        assert server.send(attempt, Work(RUN, 2, 4, (9,), ws)) is None
        assert task.receive() == Work(RUN, 2, 4, (9,), ws)
        task.send(Answers(RUN, 2, 4, (9,), [Decline(2, 9, 1, "x")]))
        _wait(server, lambda: bool(server.inbox))
        assert server.inbox == [(attempt, Answers(RUN, 2, 4, (9,), [Decline(2, 9, 1, "x")]))]
        task.close()
        _wait(server, lambda: bool(server.dropped))
        assert server.dropped == [attempt] and not server.fencing.live
    finally:
        server.close()


def test_a_task_without_the_token_is_refused_and_a_driver_without_it_is_not_trusted():
    token = new_token()
    server = ChannelServer("127.0.0.1", token, RUN, 1)
    try:
        with pytest.raises((ChannelError, OSError)):
            _connect(server, new_token())
        _wait(server, lambda: bool(server.refused))
        assert "bad HMAC" in server.refused[0] and not server.fencing.live
    finally:
        server.close()
    # a listener that answers but does not hold the token: the task gives up
    impostor = ChannelServer("127.0.0.1", new_token(), RUN, 1)
    try:
        with pytest.raises((ChannelError, OSError)):
            _connect(impostor, token)
    finally:
        impostor.close()


def test_a_newer_attempt_fences_the_older_connection():
    token = new_token()
    server = ChannelServer("127.0.0.1", token, RUN, 1)
    try:
        old = _connect(server, token, tid=3)
        _wait(server, lambda: 0 in server.fencing.live)
        first = server.fencing.live[0]
        new = _connect(server, token, attempt=1, tid=8)
        _wait(server, lambda: server.fencing.live.get(0, first) != first)
        assert server.fencing.live[0].task_attempt_id == 8 and first in server.dropped
        with pytest.raises((ChannelClosed, OSError)):
            old.receive()  # its connection was cut
        assert server.send(first, Stop(RUN)) is not None  # nothing goes to a fenced attempt
        with pytest.raises((ChannelError, OSError)):
            _connect(server, token, tid=5)  # older than the live attempt: refused
        assert "not newer than the live attempt 8" in server.refused[-1]
        new.close()
    finally:
        server.close()


def test_a_closing_driver_ends_the_task_side():
    token = new_token()
    server = ChannelServer("127.0.0.1", token, RUN, 1)
    task = _connect(server, token)
    _wait(server, lambda: 0 in server.fencing.live)
    ended = threading.Event()

    def serve():
        try:
            task.receive()
        except (ChannelClosed, OSError):
            ended.set()

    threading.Thread(target=serve, daemon=True).start()
    server.close()
    assert ended.wait(5)
    with pytest.raises(OSError):
        socket.create_connection(server.address, timeout=1)


@settings(max_examples=200, deadline=None)
@given(
    st.integers(1, 4),
    st.lists(
        st.tuples(
            st.sampled_from(["answer", "lose"]),
            st.integers(0, 3),
            st.integers(0, 2),
            st.integers(3, 5),
            st.booleans(),
        ),
        max_size=30,
    ),
)
def test_a_round_keeps_exactly_the_sent_attempts_first_answers_of_its_checkpoint(tasks, events):
    """Whatever arrives, from whichever attempt (0: the one sent to, 1: an older one, 2: a
    newer one), for whichever checkpoint: a task's answers count once, only from the attempt
    its work went to and only for this checkpoint, and never after it was lost."""
    r = EpochRound(RUN, 4)
    sent = {t: TaskAttempt(t, 0, 10 * t + 5, t) for t in range(tasks)}
    for t, a in sent.items():
        r.sent(a, [UnitWork(4, 1, 100 * t + i, ()) for i in range(2)])
    kept: dict[int, list] = {}
    gone: set[int] = set()
    for kind, t, which, cid, full in events:
        if t >= tasks:
            continue
        a = sent[t]
        attempt = (
            a if which == 0 else TaskAttempt(t, which, a.task_attempt_id + (0, -1, 1)[which], 9)
        )
        us = (100 * t, 100 * t + 1) if full else (100 * t,)
        if kind == "lose":
            lost = r.lost_task(attempt)
            assert lost == (which == 0 and t not in kept and t not in gone)
            if lost:
                gone.add(t)
            continue
        items = [AckBatch.of([Ack(cid, u, 1, ()) for u in us])]
        why = r.take(Answers(RUN, cid, attempt.task_attempt_id, us, items), attempt)
        ok = which == 0 and cid == 4 and full and t not in kept and t not in gone
        assert (why is None) == ok, why
        if ok:
            kept[t] = items
    assert r.arrived() == [i for t in r.answered for i in kept[t]]
    assert set(r.answered) == set(kept) and set(r.lost) == gone
    assert r.done == (set(kept) | gone == set(range(tasks)))
    assert r.lost_units == sorted(100 * t + i for t in gone for i in range(2))
