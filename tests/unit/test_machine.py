"""Cores per node, and the summary's line about an oversubscribed run (issue 16 item 3)."""

from __future__ import annotations

import pytest

from nlevel.runtime import machine
from nlevel.runtime.report import oversubscription_note


def test_ranks_of_a_node_add_up_and_their_affinities_unite():
    a = {"n1": {"ranks": 1, "mask": 0b01, "limit": None}}
    b = {"n1": {"ranks": 1, "mask": 0b10, "limit": 8}, "n2": {"ranks": 1, "mask": 0b1, "limit": None}}
    m = machine.merge(machine.merge(a, b), {"n1": {"ranks": 2, "mask": 0b11, "limit": 4}})
    assert m == {"n1": {"ranks": 4, "mask": 0b11, "limit": 4}, "n2": {"ranks": 1, "mask": 0b1, "limit": None}}
    assert a == {"n1": {"ranks": 1, "mask": 0b01, "limit": None}}  # inputs untouched


def test_placement_counts_cores_capped_by_the_limit():
    p = machine.placement({"n1": {"ranks": 4, "mask": 0b11, "limit": None},
                           "n2": {"ranks": 2, "mask": 0xFF, "limit": 2}})
    assert p == {"nodes": 2, "ranks": 6, "cores": 4,
                 "oversubscribed": [{"host": "n1", "ranks": 4, "cores": 2}]}
    assert machine.placement({"n": {"ranks": 2, "mask": 0b11, "limit": None}})["oversubscribed"] == []


def test_the_note_explains_an_oversubscribed_run_in_one_line():
    one = machine.placement({"laptop": {"ranks": 4, "mask": 0b11, "limit": None}})
    note = oversubscription_note(one)
    assert note.startswith("note: 4 processes on 2 cores (laptop): oversubscribed")
    assert "run -n 2 (one process per core)" in note and "\n" not in note
    many = machine.placement({"a": {"ranks": 4, "mask": 0b11, "limit": None}, "b": {"ranks": 2, "mask": 0b11, "limit": None},
                              "c": {"ranks": 9, "mask": 0b111, "limit": None}})
    assert "more processes than cores on 2 of 3 nodes (e.g. c: 9 on 3)" in oversubscription_note(many)
    assert oversubscription_note(machine.placement({"a": {"ranks": 2, "mask": 0b11, "limit": None}})) == ""
    assert oversubscription_note(None) == ""


@pytest.mark.parametrize("files,cores", [
    ({"cpu.max": "150000 100000\n"}, 2),            # cgroup v2: 1.5 CPUs' worth -> 2 busy at once
    ({"cpu.max": "max 100000\n"}, None),            # no quota
    ({"cpu/cpu.cfs_quota_us": "300000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 3),  # v1
    ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, None),
    ({}, None),
])
def test_a_container_quota_caps_the_cores(tmp_path, monkeypatch, files, cores):
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    proc = tmp_path / "cgroup"
    proc.write_text("1:cpu:/\n0::/\n")
    real = machine._cgroup_quota
    monkeypatch.setattr(machine, "_cgroup_quota", lambda: real(str(tmp_path), str(proc)))
    assert machine.cpu_limit({}) == cores
    assert machine.cpu_limit({"SLURM_CPUS_ON_NODE": "1"}) == 1  # the allocation caps it too
