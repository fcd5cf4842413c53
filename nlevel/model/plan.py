"""The hierarchy plan: how many levels, how many regions per level, and how ids flow.

A :class:`Plan` is the one object the runtime takes to lay out master, region-masters
and slaves. It is a value: chosen from settings today (``--levels``, ``--regions``,
``NLEVEL_*``), chosen from measurements by the planner later; the runtime does not
care which. Pure Python, no MPI.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from typing import Any, Final

from ..errors import ConfigError, PlanError

__all__ = ["Plan", "SERVE_ONLY_CHOICES", "default_regions", "parse_force"]

#: Which servers do not run tasks: nobody, the master only, or every master/region-master.
SERVE_ONLY_CHOICES: Final = ("none", "master", "all")


@dataclass(frozen=True)
class Plan:
    """A hierarchy plan.

    Attributes:
        levels: Number of levels: 2 is classic master–slave, 3 adds one level of
            region-masters, 4 two levels, and so on.
        regions: For each of the ``levels - 2`` intermediate levels, how many regions
            every block of processes is split into (the master's block is the world).
        prefetch: How many requests' worth of ids a region-master keeps queued for
            each process of its region, so a slave's request is answered locally.
        chunk: Ids a slave asks for per request; 0 means automatic (sized from the
            measured task time so that cheap tasks are fetched in batches).
        serve_only: Which servers do not run tasks themselves: ``"none"``,
            ``"master"`` or ``"all"`` (master and region-masters).
        reason: Why this plan was chosen, for the run report.
    """

    levels: int = 2
    regions: tuple[int, ...] = ()
    prefetch: float = 2.0
    chunk: int = 0
    serve_only: str = "none"
    reason: str = "set by configuration"
    extra: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        if isinstance(self.levels, bool) or not isinstance(self.levels, int) or self.levels < 2:
            raise PlanError(f"levels must be an integer >= 2, got {self.levels!r}")
        if len(self.regions) != self.levels - 2:
            raise PlanError(
                f"levels={self.levels} needs {self.levels - 2} region count(s) "
                f"(one per intermediate level), got regions={list(self.regions)}"
            )
        for r in self.regions:
            if isinstance(r, bool) or not isinstance(r, int) or r < 2:
                raise PlanError(f"every region count must be an integer >= 2, got {list(self.regions)}")
        if not (isinstance(self.prefetch, (int, float)) and self.prefetch >= 1):
            raise PlanError(f"prefetch must be a number >= 1, got {self.prefetch!r}")
        if isinstance(self.chunk, bool) or not isinstance(self.chunk, int) or self.chunk < 0:
            raise PlanError(f"chunk must be an integer >= 0 (0 = automatic), got {self.chunk!r}")
        if self.serve_only not in SERVE_ONLY_CHOICES:
            raise PlanError(f"serve_only must be one of {', '.join(SERVE_ONLY_CHOICES)}; got {self.serve_only!r}")

    def min_size(self) -> int:
        """Return the smallest world that holds this plan.

        Every region at every intermediate level needs a region-master and at least
        one slave, so a plan with region counts r1, r2, ... needs 2 * r1 * r2 * ... ranks.
        """
        if self.levels == 2:
            return 2 if self.serve_only != "none" else 1
        return 2 * math.prod(self.regions)

    def check_fits(self, size: int) -> None:
        """Raise PlanError unless this plan can be laid out on ``size`` processes."""
        if size < self.min_size():
            if self.levels == 2:
                raise PlanError(
                    f"serve_only={self.serve_only!r} needs at least 2 processes (a master that "
                    f"only serves and one worker), got {size}"
                )
            raise PlanError(
                f"plan with levels={self.levels} and regions={list(self.regions)} needs at least "
                f"{self.min_size()} processes (each region a region-master and at least one slave), "
                f"got {size}"
            )

    def describe(self) -> str:
        """Return a one-line human summary, e.g. ``3 levels, 4 regions, serve-only master``."""
        parts = [f"{self.levels} levels"]
        if self.regions:
            parts.append("regions " + "x".join(str(r) for r in self.regions))
        parts.append(f"chunk {'auto' if self.chunk == 0 else self.chunk}")
        if self.serve_only != "none":
            parts.append(f"serve-only {self.serve_only}")
        return ", ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-ready dict (stored in the report and the checkpoint)."""
        d = asdict(self)
        d["regions"] = list(self.regions)
        return d

    def to_json(self) -> str:
        """Return :meth:`to_dict` as JSON text."""
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Plan:
        """Build a plan from :meth:`to_dict` output."""
        d = dict(d)
        d["regions"] = tuple(d.get("regions", ()))
        return cls(**d)


def default_regions(size: int, levels: int) -> tuple[int, ...]:
    """Return region counts that give every server about the same number of children.

    With ``levels - 1`` server generations over ``size`` ranks, each split uses about
    ``size ** (1 / (levels - 1))`` regions, capped so every region keeps a slave.

    Raises:
        PlanError: when ``size`` is too small for ``levels``.
    """
    n_splits = levels - 2
    if n_splits <= 0:
        return ()
    if size < 2 ** (n_splits + 1):
        raise PlanError(
            f"levels={levels} needs at least {2 ** (n_splits + 1)} processes "
            f"(each region a region-master and at least one slave), got {size}"
        )
    per = max(2, round(size ** (1.0 / (levels - 1))))
    regions: list[int] = []
    block = size
    for _ in range(n_splits):
        # The last split must leave >= 2 ranks per region at every deeper level.
        deeper = 2 ** (n_splits - len(regions) - 1)
        r = max(2, min(per, block // (2 * deeper)))
        regions.append(r)
        block //= r
    return tuple(regions)


def parse_force(text: str) -> tuple[float, Plan] | None:
    """Parse ``force_replan`` (``"F@L"`` or ``"F@LxR1[xR2]"``): at committed fraction F switch to that plan.

    Raises:
        ConfigError: naming the text and the expected form.
    """
    if not text:
        return None
    try:
        frac_s, plan_s = text.split("@")
        frac = float(frac_s)
        parts = [int(x) for x in plan_s.lower().split("x")]
        levels, regions = parts[0], tuple(parts[1:])
        if not 0 <= frac < 1:
            raise ValueError
        return frac, Plan(levels, regions or (2,) * (levels - 2), reason=f"forced by force_replan={text}")
    except (ValueError, TypeError):
        raise ConfigError(
            f"force_replan must look like 0.5@3 or 0.5@3x2 (committed fraction @ levels x regions), got {text!r}"
        ) from None
