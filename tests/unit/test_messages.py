"""The wire messages (:mod:`nlevel.roles.messages`): every kind round-trips, bad input is refused."""

import dataclasses
import pickle
import typing

import pytest

from nlevel.model.plan import Plan
from nlevel.roles.messages import (
    MESSAGES, Ack, Message, BoardOp, BoardReply, Drain, Ending, FailureRecord, Gone, Halt, Heartbeat, Holding, KillRequest,
    Mirror,
    TAGS, Regroup, Release, Safe, Report, Tag, TaskFailure, TimedOut, InQuestion, decode, encode,
)

FAILURE = TaskFailure(7, "raised", "ValueError: bad", 3, "h", "Traceback ...", 2)
RECORD = FailureRecord(4, "region-master", 1, "ulfm", 0, 12.5, 9, 1.5, "deputy's copy", 9, (3,), 12.6, 100.0, 7)

# One message of every kind, every field set away from its default, so that a field
# dropped or reordered by encode/decode shows.
SAMPLES = [
    Report(((0, 5), (9, 10)), ((3, 1.5), (4, (2.0, 3.0))), ((20, 22),), (FAILURE,), True, 2, True, 5, 0.25, 0.75, 4.5,
           Ending(({"rank": 3, "tasks": 7},), {"unexpected": 0}), 96, 12),
    Regroup(2, Plan(3, (2,), reason="r"), (5, 6)),
    Ack(5),
    Holding(((1, 4), (8, 9)), (3, 6), True, 12, ((3, ((5, 6),)),), ((10, 12),), True, 2),
    Mirror(((0, 10),), ((1, 0.5),), 100, 2, True, (RECORD,), (FAILURE,), ((7, 2),), (((7, 8),), ((7, 8),)), ((3, 5),), 40),
    Drain("drained by a test"),
    KillRequest(6, "hung"),
    BoardOp(1, "cas", 7, 3, 4),
    BoardReply((1, 2, 3)),
    Gone((4, 5), "task timeout"),
    Heartbeat(3, 2.5),
    TimedOut(3, ((17, 18),), 2.5, "h"),
    Ending(({"rank": 3, "tasks": 7},), {"unexpected": 1, "failures": []}),
    Release(1, (2, 5), {"complete": False}, True, "cannot write checkpoint run.h5: No space left on device", 28),
    Halt(2, "ValueError: result of task 0 must be a number (x), got 'a'"),
    Safe(41),
    InQuestion(((3, 9), (12, 13)), (RECORD,)),
]
DEFAULTS = [Report(), Regroup(0, Plan()), Ack(0), Holding(), Mirror(), Drain(), KillRequest(0), BoardOp(0, "read", 0),
            BoardReply(()), Gone(()), Heartbeat(), TimedOut(0, (), 0.0), Ending((), {}), Release(0),
            Halt(0, ""), Safe(0), InQuestion(())]


def kind(msg):
    return type(msg).__name__


def test_the_samples_cover_every_kind_with_every_field_set():
    assert {type(m) for m in SAMPLES} == set(MESSAGES) == {type(m) for m in DEFAULTS}
    assert len(SAMPLES) == len(MESSAGES) == len(Tag)
    for m in SAMPLES:
        for f in dataclasses.fields(m):
            default = f.default if f.default is not dataclasses.MISSING else None
            assert getattr(m, f.name) != default, (kind(m), f.name)


@pytest.mark.parametrize("msg", SAMPLES + DEFAULTS, ids=[kind(m) for m in SAMPLES] + [f"{kind(m)}-default" for m in DEFAULTS])
def test_round_trip(msg):
    tag, payload = encode(msg)
    assert tag == TAGS[type(msg)] and isinstance(tag, int)
    assert isinstance(payload, tuple) and len(payload) == len(dataclasses.fields(msg))
    back = decode(tag, pickle.loads(pickle.dumps(payload)))
    assert type(back) is type(msg) and back == msg
    assert encode(back) == (tag, payload)


def test_messages_are_frozen_and_each_class_has_a_tag():
    for m in SAMPLES:
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(m, dataclasses.fields(m)[0].name, None)
        assert isinstance(TAGS[type(m)], Tag)


def test_tags_are_small_and_distinct():
    assert len({int(t) for t in Tag}) == len(Tag)
    assert all(0 <= t <= 32767 for t in Tag)
    assert sorted(TAGS[m] for m in MESSAGES) == sorted(Tag)
    assert set(TAGS) == set(typing.get_args(Message))  # (every wire message has a tag)


@pytest.mark.parametrize("tag", [99, 0, -1, 10, 12, 32768])
def test_unknown_tag(tag):
    with pytest.raises(ValueError, match=f"unknown nlevel message tag {tag}; expected one of"):
        decode(tag, ())


@pytest.mark.parametrize("msg", SAMPLES, ids=kind)
def test_payload_of_the_wrong_shape(msg):
    tag, payload = encode(msg)
    for bad in (payload[:-1], payload + (None,), list(payload), None):
        with pytest.raises(ValueError, match=f"malformed {kind(msg)} payload"):
            decode(tag, bad)


def test_a_task_failure_says_which_task_where_and_how():
    assert FAILURE.line() == "task 7 raised on rank 3 (h) after 2 attempts: ValueError: bad"
    assert TaskFailure(9, "died", "quarantined").line() == "task 9 died: quarantined"


def test_a_failure_record_closes_with_its_recovery():
    closed = FailureRecord(4, "slave", 2, "ulfm", 0, 10.0, 3).closed(3, (5,), 10.25)
    assert closed.requeued == 3 and closed.quarantined == (5,) and closed.recovery_ms == 250.0
    assert closed.to_dict()["quarantined"] == [5]
