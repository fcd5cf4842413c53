"""Named network profiles: one-way message time and one-sided (fetch-and-op) times of a network. Pure.

``python -m nlevel.sim --network NAME`` and ``python -m nlevel.plan --network NAME`` take
their message and one-sided times from here; the service time (a server's CPU per message)
stays the machine's (calibration or ``--service-time``), and an explicit ``--msg-time``,
``--atomic-time`` or ``--atomic-service`` overrides the profile's figure.

Every figure below is either measured here or published, and says where it comes from;
where no published figure was found, the field is ``None`` (the tools then keep their own
default, and say so) or derived, with the derivation written next to it.

``shm``: this machine (2-core VM, Open MPI 5.0.11, shared memory), measured by
    ``python -m nlevel.plan --calibrate --calibration /tmp/cal-shm.json`` at commit b04d400;
    the JSON, with command and commit, is ``bench/results/calibration-shm.json``.
    One-way message 4.03 µs (half the median request/reply round trip, 8.06 µs); one
    one-sided operation 0.79 µs at the origin, 0.79 µs at the target.

``ib-hdr``: 200 Gb/s HDR InfiniBand.
    * Message: 1.2 µs one way. Microsoft Azure, "HBv3-series virtual machine performance",
      table "Performance expectations": "RDMA latency & bandwidth | 1.2 microseconds
      (1-byte), 192 Gb/s (one-way)" (https://learn.microsoft.com/azure/virtual-machines/hbv3-performance,
      source MicrosoftDocs/azure-docs articles/virtual-machines/hbv3-performance.md); the page runs
      OSU ``osu_latency`` for it. HBv3's network: "All HBv3-series VMs feature 200 Gb/sec HDR
      InfiniBand" (articles/virtual-machines/hbv3-series.md).
    * One-sided operation at the origin: 2.4 µs, *derived*: no published ``osu_fop_latency``
      (MPI_Fetch_and_op + flush) figure on HDR was found. A fetching atomic needs its result
      back, so it costs at least one network round trip, 2 x 1.2 µs; this is a lower bound
      (a software-emulated atomic, e.g. Open MPI's osc/ucx for accumulate, costs more:
      open-mpi/ompi issue #6868 reports ~10 µs per MPI_Accumulate with UCX against ~2.5 µs with MVAPICH).
    * Time an atomic occupies the target: not published; ``None``.

``slingshot-11``: HPE Slingshot-11 (Cassini NIC, Rosetta switch).
    * Message: 2.76 µs one way. EESSI, "MPI at Warp Speed: EESSI Meets Slingshot-11 (part 2)"
      (https://www.eessi.io/docs/blog/2026/05/11/EESSI-on-Cray-Slingshot-part2/, source
      EESSI/docs docs/blog/posts/2026/05/eessi-cray-slingshot11-part2.md): OSU 7.5 ``osu_latency D D``,
      cray-mpich 8.1.32, two Grace-Hopper nodes of Olivia, 1 byte: 2.76 µs (2.79 µs with EESSI's
      Open MPI 5.0.3). These are GPU-memory buffers: host-memory latency on the same network
      is likely lower, so this figure is an upper bound; no host-memory Slingshot-11
      ``osu_latency`` figure was found. De Sensi et al., "An In-Depth Analysis of the Slingshot
      Interconnect" (SC20, arXiv:2008.08886) measured Slingshot-10 (ConnectX-5 NICs), not
      Slingshot-11, and its figures were not available here as text.
    * One-sided operation at the origin: 5.52 µs, *derived* as for ib-hdr: 2 x 2.76 µs.
    * Time an atomic occupies the target: not published; ``None``.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError

__all__ = ["Profile", "PROFILES", "get_profile", "profile_names"]


@dataclass(frozen=True)
class Profile:
    """One network's communication times (seconds); ``None``: no figure, keep the tool's default.

    Attributes:
        name: The ``--network`` name.
        msg_time: One message, one way (half an ``osu_latency``-style round trip).
        atomic_time: One one-sided fetch-and-op as its origin sees it (a round trip).
        atomic_service: The time one such operation occupies the target's NIC or memory.
        source: Where each figure comes from, in a line (the module docstring has the detail).
    """

    name: str
    msg_time: float
    atomic_time: float | None
    atomic_service: float | None
    source: str

    def to_dict(self) -> dict[str, object]:
        """The profile as a JSON-ready dict."""
        return {"name": self.name, "msg_time": self.msg_time, "atomic_time": self.atomic_time,
                "atomic_service": self.atomic_service, "source": self.source}


PROFILES: dict[str, Profile] = {
    p.name: p
    for p in (
        Profile("shm", 4.03099966206355e-06, 7.910002750577405e-07, 7.920007192296907e-07,
                "measured here: bench/results/calibration-shm.json (nlevel.plan --calibrate, commit b04d400)"),
        Profile("ib-hdr", 1.2e-06, 2.4e-06, None,
                "message: Azure HBv3 (HDR 200 Gb/s) performance page, RDMA latency 1.2 us (1 byte); "
                "fetch-and-op: derived, 2 x message (one round trip); target occupancy: not published"),
        Profile("slingshot-11", 2.76e-06, 5.52e-06, None,
                "message: EESSI Slingshot-11 blog part 2, osu_latency D D 1 byte, cray-mpich 2.76 us (GPU "
                "buffers: an upper bound); fetch-and-op: derived, 2 x message; target occupancy: not published"),
    )
}


def profile_names() -> tuple[str, ...]:
    """The known profile names, in the order they are listed."""
    return tuple(PROFILES)


def get_profile(name: str) -> Profile:
    """The profile called ``name``.

    Raises:
        ConfigError: ``--network must be one of shm, ib-hdr, slingshot-11, got 'x'``.
    """
    p = PROFILES.get(name)
    if p is None:
        raise ConfigError(f"--network must be one of {', '.join(PROFILES)}, got {name!r}")
    return p
