"""The wire messages (:mod:`nlevel.roles.messages`): every kind round-trips, bad input is refused."""

import dataclasses
import pickle

import pytest

from nlevel.roles.messages import (
    TAG_OF,
    Ack,
    Drain,
    Failed,
    Grant,
    Holding,
    Kill,
    Mirror,
    Regroup,
    Report,
    Tag,
    decode,
    encode,
)

# One message of every kind, every field set away from its default, so that a field
# dropped or reordered by encode/decode shows.
SAMPLES = [
    Report(((0, 5), (9, 10)), ((3, 1.5), (4, (2.0, 3.0))), 4, ((20, 22),), True, 2, True, 0.25, 1e-4,
           ((7, "ValueError: bad, rank 3, host h"),), 0.75),
    Grant(((7, 9),), True, 1e-3, 1e-4, 3),
    Regroup(2, {"levels": 3, "regions": [2], "prefetch": 2.0, "chunk": 0, "serve_only": "none", "reason": "r"}),
    Ack(5),
    Holding(((1, 4), (8, 9)), (3, 6), True),
    Mirror(((0, 10),), ((1, 0.5),), 100, 2, True, ({"rank": 4, "role": "region-master", "held": [1, 2]},)),
    Kill(6),
    Failed((2, 5), "lease expired"),
    Drain("drained by a test"),
]
DEFAULTS = [Report(), Grant(), Regroup(0, {}), Ack(0), Holding(), Mirror(), Kill(0), Failed(()), Drain()]


def kind(msg):
    return type(msg).__name__


def test_the_samples_cover_every_kind_with_every_field_set():
    assert {type(m) for m in SAMPLES} == set(TAG_OF) == {type(m) for m in DEFAULTS}
    assert len(SAMPLES) == len(TAG_OF) == len(Tag)
    for m in SAMPLES:
        for f in dataclasses.fields(m):
            default = f.default if f.default is not dataclasses.MISSING else None
            assert getattr(m, f.name) != default, (kind(m), f.name)


@pytest.mark.parametrize("msg", SAMPLES + DEFAULTS, ids=[kind(m) for m in SAMPLES] + [f"{kind(m)}-default" for m in DEFAULTS])
def test_round_trip(msg):
    tag, payload = encode(msg)
    assert tag == TAG_OF[type(msg)] and isinstance(tag, int)
    assert isinstance(payload, tuple) and len(payload) == len(dataclasses.fields(msg))
    back = decode(tag, pickle.loads(pickle.dumps(payload)))
    assert type(back) is type(msg) and back == msg
    assert encode(back) == (tag, payload)


def test_tags_are_small_and_distinct():
    assert len({int(t) for t in Tag}) == len(Tag)
    assert all(0 <= t <= 32767 for t in Tag)
    assert sorted(TAG_OF.values()) == sorted(Tag)


@pytest.mark.parametrize("tag", [99, 0, -1, 10, 20, 32768])
def test_unknown_tag(tag):
    with pytest.raises(ValueError, match=f"unknown nlevel message tag {tag}; expected one of"):
        decode(tag, ())


@pytest.mark.parametrize("msg", SAMPLES, ids=kind)
def test_payload_of_the_wrong_shape(msg):
    tag, payload = encode(msg)
    for bad in (payload[:-1], payload + (None,), list(payload), None):
        with pytest.raises(ValueError, match=f"malformed {kind(msg)} payload"):
            decode(tag, bad)


def test_a_payload_of_another_shape_under_a_tag_is_refused():
    with pytest.raises(ValueError, match="malformed Grant payload"):
        decode(Tag.GRANT, (1, 2))
    with pytest.raises(ValueError, match="malformed Ack payload"):
        decode(Tag.ACK, encode(Kill(3))[1] + (0,))
