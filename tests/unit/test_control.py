"""Operator input never raises inside the master (issue 34): every malformed control file is answered.

The files go into a real control directory; the master's side is the runtime's own
(``MpiPort.requests``, ``control.Inbox``) in front of a real master ``Station`` of the
in-process network, driven by the loop's ``control`` step, as on a running job.
"""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

import pytest

from nlevel.config import Config
from nlevel.model.plan import Plan
from nlevel.roles.events import Answer, DrainRequest
from nlevel.runtime import control
from nlevel.runtime.rank import MpiPort
from nlevel.testing.network import Network

#: 8 ranks, 3 levels, serve-only servers: master 0, region-master 4 (serve-only), slaves 1-3 and 5-7.
PLAN = Plan(3, (2,), serve_only="all")
SLAVES = [1, 2, 3, 5, 6, 7]

BAD_JSON = {
    "the issue's: a rank as text": {"action": "drain", "ranks": ["3"]},
    "the issue's: a negative count": {"action": "drain", "count": -3},
    "count 0": {"action": "drain", "count": 0},
    "count huge": {"action": "drain", "count": 10**30},
    "count as text": {"action": "drain", "count": "2"},
    "count true": {"action": "drain", "count": True},
    "count false": {"action": "drain", "count": False},
    "count 2.5": {"action": "drain", "count": 2.5},
    "count 2.0": {"action": "drain", "count": 2.0},
    "count a list": {"action": "drain", "count": [2]},
    "count an object": {"action": "drain", "count": {"n": 2}},
    "count = every slave": {"action": "drain", "count": len(SLAVES)},
    "count > the slaves": {"action": "drain", "count": len(SLAVES) + 1},
    "neither ranks nor count": {"action": "drain"},
    "both null": {"action": "drain", "ranks": None, "count": None},
    "both ranks and count": {"action": "drain", "ranks": [5], "count": 1},
    "ranks empty": {"action": "drain", "ranks": []},
    "ranks twice": {"action": "drain", "ranks": [3, 3]},
    "ranks negative": {"action": "drain", "ranks": [-1]},
    "rank not in the job": {"action": "drain", "ranks": [99]},
    "rank huge": {"action": "drain", "ranks": [10**30]},
    "rank of a serve-only server": {"action": "drain", "ranks": [4]},
    "the master itself": {"action": "drain", "ranks": [0]},
    "rank true": {"action": "drain", "ranks": [True]},
    "rank 2.5": {"action": "drain", "ranks": [2.5]},
    "rank 3.0": {"action": "drain", "ranks": [3.0]},
    "rank null": {"action": "drain", "ranks": [None]},
    "ranks mixed": {"action": "drain", "ranks": [1, "2"]},
    "ranks nested": {"action": "drain", "ranks": [[3]]},
    "ranks an object": {"action": "drain", "ranks": {"3": True}},
    "ranks as text": {"action": "drain", "ranks": "3"},
    "ranks a number": {"action": "drain", "ranks": 3},
    "every slave (none would run tasks)": {"action": "drain", "ranks": SLAVES},
    "unknown action": {"action": "stop", "count": 1},
    "no action": {"count": 1},
    "action null": {"action": None, "count": 1},
    "action a list": {"action": ["drain"], "count": 1},
    "action in capitals": {"action": "DRAIN", "count": 1},
    "unknown key": {"action": "drain", "rank": 3},
    "submitted_at as text": {"action": "drain", "count": 1, "submitted_at": "yesterday"},
    "a list": [{"action": "drain", "count": 1}],
    "a string": "drain",
    "null": None,
    "a number": 42,
}

BAD_BYTES = {
    "a key twice": b'{"action": "drain", "count": 1, "count": 2}',
    "not JSON": b"{action: drain, count: 1}",
    "truncated": b'{"action": "drain", "count": ',
    "empty": b"",
    "whitespace": b" \n\t ",
    "binary garbage": bytes(range(256)) * 4,
    "UTF-16": json.dumps({"action": "drain", "count": 1}).encode("utf-16"),
    "NaN count": b'{"action": "drain", "count": NaN}',
    "Infinity count": b'{"action": "drain", "count": Infinity}',
    "a count of 5000 digits": b'{"action": "drain", "count": ' + b"1" * 5000 + b"}",
    "nested 100000 deep": b"[" * 100_000 + b"]" * 100_000,
    "huge": b'{"action": "drain", "count": 1}' + b" " * control.MAX_BYTES,
    "a second object after the first": b'{"action": "drain", "count": 1} {"action": "drain", "count": 2}',
}


def _name(i: int) -> str:
    return f"request-{i:03d}.json"


def _master(tmp_path):
    """A master station of the in-process network whose port reads a real control directory."""
    net = Network(8, PLAN, 400, 0, config=Config(levels=3, regions=(2,), serve_only="all", control_interval=1e-6))
    port = MpiPort(SimpleNamespace(rank=0), net.config, str(tmp_path / "run.h5"), None, None, 1)
    os.makedirs(port.control_dir)
    net.ports[0].requests = port.requests
    net.ports[0].answer = port.answer
    return net, port


def _look(net, port):
    port._control_at = 0.0
    net.loops[0].control()


def _answers(directory):
    return {n[:-len(".done")]: json.loads(open(os.path.join(directory, n)).read())
            for n in os.listdir(directory) if n.endswith(".done")}


def _plant_odd_files(d, outside):
    """Things that are not request files, under request names; returns their names."""
    names = {}
    os.mkdir(os.path.join(d, "request-dir.json"))
    (outside / "inside.txt").write_text("an operator's file")
    os.rename(outside / "inside.txt", os.path.join(d, "request-dir.json", "inside.txt"))
    names["a directory"] = "request-dir.json"
    os.symlink("request-loop.json", os.path.join(d, "request-loop.json"))
    names["a symlink loop"] = "request-loop.json"
    good = outside / "good.json"
    good.write_text(json.dumps({"action": "drain", "count": 1}))
    os.symlink(good, os.path.join(d, "request-link.json"))
    names["a symlink to a good request"] = "request-link.json"
    os.symlink(outside / "nothing-here", os.path.join(d, "request-dangling.json"))
    names["a dangling symlink"] = "request-dangling.json"
    os.mkfifo(os.path.join(d, "request-fifo.json"))
    names["a named pipe (reading it would block)"] = "request-fifo.json"
    return names


def test_fifty_malformed_control_files_are_each_answered_with_an_error_and_nothing_drained(tmp_path):
    net, port = _master(tmp_path)
    d = port.control_dir
    cases = {}
    for i, (what, value) in enumerate(BAD_JSON.items()):
        with open(os.path.join(d, _name(i)), "w") as f:
            json.dump(value, f)
        cases[_name(i)] = what
    for i, (what, raw) in enumerate(BAD_BYTES.items(), start=len(BAD_JSON)):
        with open(os.path.join(d, _name(i)), "wb") as f:
            f.write(raw)
        cases[_name(i)] = what
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    cases.update({name: what for what, name in _plant_odd_files(d, outside).items()})
    assert len(cases) >= 50
    _look(net, port)
    st = net.stations[0]
    answers = _answers(d)
    missing = sorted(cases[n] for n in cases if n not in answers)
    assert not missing, f"not answered: {missing}"
    for name, what in cases.items():
        a = answers[name]
        assert "error" in a and "result" not in a, (what, a)
        assert isinstance(a["error"], str) and a["error"], (what, a)
    assert st.drained == {} and not st.drain_requested
    assert not net.channels, "a refused request sent something"
    # The issue's two files are answered naming the value.
    assert "'3' (str)" in answers[_name(0)]["error"]
    assert "-3" in answers[_name(1)]["error"]
    # Every request file is cleared away (a directory kept aside, with what was in it); nothing is read twice.
    left = sorted(n for n in os.listdir(d) if not n.endswith(".done"))
    assert left == ["request-dir.json.refused"], left
    assert os.listdir(os.path.join(d, "request-dir.json.refused")) == ["inside.txt"]
    assert os.path.exists(outside / "good.json")  # (a link's target is never touched)
    before = _answers(d)
    _look(net, port)
    assert _answers(d) == before
    # The master still acts on a good request afterwards.
    path = control.submit(d, {"action": "drain", "count": 1})
    _look(net, port)
    assert control.wait_answer(path, 1.0)["result"] == {"ranks": [7]}
    assert list(st.drained) == [7]


@pytest.mark.parametrize("request_", [
    DrainRequest("t", ranks=("3",)), DrainRequest("t", ranks=(True,)), DrainRequest("t", ranks=(2.5,)),  # type: ignore[arg-type]
    DrainRequest("t", ranks=(3, 3)), DrainRequest("t", ranks=()), DrainRequest("t", ranks=(-1,)),
    DrainRequest("t", ranks=(99,)), DrainRequest("t", ranks=(4,)), DrainRequest("t", ranks=3),  # type: ignore[arg-type]
    DrainRequest("t", ranks=object()),  # type: ignore[arg-type]
    DrainRequest("t", count=-3), DrainRequest("t", count=0), DrainRequest("t", count="2"),  # type: ignore[arg-type]
    DrainRequest("t", count=2.5), DrainRequest("t", count=True), DrainRequest("t", count=6),  # type: ignore[arg-type]
    DrainRequest("t", count=10**30), DrainRequest("t"), DrainRequest("t", ranks=(5,), count=1),
])
def test_station_drain_is_total(request_):
    """The master's state machine answers any DrainRequest, and changes nothing when it refuses."""
    net = Network(8, PLAN, 400, 0)
    st = net.stations[0]
    out = st.handle(request_)
    assert [type(e) for e in out] == [Answer] and "error" in out[0].outcome, out
    assert st.drained == {}


def test_a_request_that_raises_anyway_is_answered_and_the_master_goes_on(tmp_path, monkeypatch):
    net, port = _master(tmp_path)
    path = control.submit(port.control_dir, {"action": "drain", "count": 1})

    def broken(request):
        raise RuntimeError("a bug")

    monkeypatch.setattr(net.stations[0], "drain", broken)
    _look(net, port)  # (does not raise)
    a = control.wait_answer(path, 1.0)
    assert "RuntimeError('a bug')" in a["error"]
    assert not os.path.exists(path) and not os.path.exists(path + ".taken")
    assert any("raised" in line for line in net.ports[0].logs)


def test_a_request_a_dead_master_took_is_answered_by_the_next_not_acted_on(tmp_path):
    """A request taken (renamed .taken) by a master that died before answering it: the new master answers
    it with an error and does not act on it; one answered already (its .done there) is cleared away."""
    net, port = _master(tmp_path)
    d = port.control_dir
    taken = os.path.join(d, "request-1.json")
    with open(taken + ".taken", "w") as f:
        json.dump({"action": "drain", "count": 1}, f)
    answered = os.path.join(d, "request-2.json")
    with open(answered + ".taken", "w") as f:
        json.dump({"action": "drain", "count": 2}, f)
    with open(answered + ".done", "w") as f:
        json.dump({"action": "drain", "count": 2, "result": {"ranks": [6, 7]}}, f)
    again = os.path.join(d, "request-3.json")  # answered, but its file was not cleared away
    with open(again, "w") as f:
        json.dump({"action": "drain", "count": 1}, f)
    with open(again + ".done", "w") as f:
        json.dump({"error": "an earlier answer"}, f)
    _look(net, port)
    assert "ended before answering" in control.wait_answer(taken, 1.0)["error"]
    assert control.wait_answer(answered, 1.0)["result"] == {"ranks": [6, 7]}
    assert control.wait_answer(again, 1.0) == {"error": "an earlier answer"}
    assert sorted(os.listdir(d)) == ["request-1.json.done", "request-2.json.done", "request-3.json.done"]
    assert net.stations[0].drained == {}


def test_an_answer_that_cannot_be_written_is_written_later(tmp_path, monkeypatch, capsys):
    """A full disk when the master answers: logged once, the job goes on, the answer is written at a later look."""
    net, port = _master(tmp_path)
    path = control.submit(port.control_dir, {"action": "drain", "count": 9})
    real = control._write

    def full(p, data):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(control, "_write", full)
    _look(net, port)
    _look(net, port)
    assert not os.path.exists(path + ".done")
    assert capsys.readouterr().err.count("cannot write the answer") == 1
    monkeypatch.setattr(control, "_write", real)
    _look(net, port)
    assert "count 9 must be less than the 6 slaves" in control.wait_answer(path, 1.0)["error"]
    assert os.listdir(port.control_dir) == [os.path.basename(path) + ".done"]


@pytest.mark.parametrize("args,expected", [
    (["--ranks", "3,3"], "--ranks names rank 3 twice"),
    (["--ranks", "3,-1"], "--ranks must be rank numbers >= 0"),
    (["--ranks", "2.5"], "--ranks must be rank numbers like 5,6"),
    (["--count", "0"], "--count must be an integer >= 1, got '0'"),
    (["--count", "-3"], "--count must be an integer >= 1, got '-3'"),
    (["--count", "2.5"], "--count must be an integer >= 1, got '2.5'"),
    (["--count", "1", "--wait", "-1"], "--wait must be a number of seconds > 0, got '-1'"),
    (["--count", "1", "--wait", "nan"], "--wait must be a number of seconds > 0, got 'nan'"),
])
def test_the_drain_command_refuses_bad_input_before_writing_anything(tmp_path, capsys, args, expected):
    from nlevel.drain import main

    d = tmp_path / "run.h5.control"
    d.mkdir()
    with pytest.raises(SystemExit) as exc:
        main([str(tmp_path / "run.h5"), *args])
    assert exc.value.code == 2 and expected in capsys.readouterr().err
    assert os.listdir(d) == []


def test_submit_refuses_what_the_job_would(tmp_path):
    with pytest.raises(ValueError, match=r"count must be a whole number >= 1, got -3"):
        control.submit(str(tmp_path), {"action": "drain", "count": -3})
    with pytest.raises(ValueError, match=r"ranks must be whole numbers >= 0, got '3' \(str\)"):
        control.submit(str(tmp_path), {"action": "drain", "ranks": ["3"]})
    assert os.listdir(tmp_path) == []
