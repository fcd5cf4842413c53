"""The emulated cluster for tests/cluster: three nodes (network namespaces on a bridge, see
:mod:`nlevel.testing.cluster`), made once per session and removed at its end, failure or not.

Where namespaces cannot be made (not root, no ``ip``), every test here is skipped with one
line saying why; with ``CI=true`` (or ``NLEVEL_REQUIRE_CLUSTER=1``, which .ci/run sets) in the
environment that is a failure instead.
"""

from __future__ import annotations

import os

import pytest

from nlevel.testing import cluster as cl

NODES = 3


def _required() -> bool:
    return os.environ.get("CI", "").lower() == "true" or os.environ.get("NLEVEL_REQUIRE_CLUSTER") == "1"


def _without(reason: str) -> None:
    if _required():
        pytest.fail(f"CI=true or NLEVEL_REQUIRE_CLUSTER=1, and the emulated cluster cannot be made: {reason}",
                    pytrace=False)
    pytest.skip(f"no emulated cluster: {reason}")


@pytest.fixture(scope="session")
def cluster():
    """A running 3-node cluster (:class:`nlevel.testing.cluster.Cluster`), owned by this session."""
    reason = cl.unavailable()
    if reason is not None:
        _without(reason)
    try:
        made = cl.up(NODES, owner=os.getpid())
    except cl.ClusterError as exc:
        _without(str(exc))
    try:
        yield made
    finally:
        cl.down(made.where, owner=os.getpid())


@pytest.fixture
def fresh_nodes(cluster):
    """The cluster, with no process left on any node after the test (a job torn down leaves daemons)."""
    yield cluster
    for node in cluster.nodes:
        cluster.thaw(node)
        cluster.mend(node)
        cluster.kill(node)
