import pickle

import pytest

from nlevel.roles.messages import TAG_OF, Grant, Report, Tag, decode, encode


@pytest.mark.parametrize("msg", [
    Report(),
    Report(((0, 5), (9, 10)), ((3, 1.5),), 4, ((20, 22),), True),
    Grant(((7, 9),), False, 1e-3, 1e-4),
    Grant((), True),
])
def test_round_trip(msg):
    tag, payload = encode(msg)
    assert tag == TAG_OF[type(msg)]
    assert decode(tag, pickle.loads(pickle.dumps(payload))) == msg


def test_tags_are_small_and_distinct():
    assert len({int(t) for t in Tag}) == len(Tag)
    assert all(0 <= t <= 32767 for t in Tag)


def test_unknown_tag_and_bad_payload():
    with pytest.raises(ValueError, match="unknown nlevel message tag 99"):
        decode(99, ())
    with pytest.raises(ValueError, match="malformed Grant payload"):
        decode(Tag.GRANT, (1, 2))
