"""What a policy asks for, and the one place that hands it to a mechanism.

A policy never changes the books: its hooks return decisions, and a mechanism (the simulator,
which moves simulated bytes, or the live service, which writes ops for adapters) carries them out.
Each decision names one state object and where it should be; the mechanism may decline one that
no longer makes sense (the copy is pinned, already there, or there is no room).

    Promote(key, group, lease_id)   bring a copy into the HBM of a GPU group (for a lease, if given)
    PromoteHost(key, node)          stage weights or expert pages in a node's DRAM
    Demote(key, group, to)          move a copy out of HBM: to "host" DRAM, or "none" (a drop)
    Cancel(key, group)              stop a load into HBM that nobody waits for any more
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Literal, Protocol


@dataclass(frozen=True, slots=True)
class Promote:
    key: tuple
    group: tuple[int, ...]
    lease_id: str | None = None


@dataclass(frozen=True, slots=True)
class PromoteHost:
    key: tuple
    node: str


@dataclass(frozen=True, slots=True)
class Demote:
    key: tuple
    group: tuple[int, ...]
    to: Literal["host", "none"]


@dataclass(frozen=True, slots=True)
class Cancel:
    key: tuple
    group: tuple[int, ...]


Decision = Promote | PromoteHost | Demote | Cancel


class Mechanism(Protocol):
    """What carries decisions out. Each method is called by `apply`, once per decision, in the
    order the policy returned them, and returns nothing: what happened shows in the books."""

    def promote(self, d: Promote) -> None: ...
    def promote_host(self, d: PromoteHost) -> None: ...
    def demote(self, d: Demote) -> None: ...
    def cancel(self, d: Cancel) -> None: ...


def apply(decisions: Iterable[Decision] | None, mech: Mechanism) -> None:
    """Hand a policy's decisions (a list, or None for none) to `mech`, in order."""
    for d in decisions or ():
        match d:
            case Promote():
                mech.promote(d)
            case PromoteHost():
                mech.promote_host(d)
            case Demote():
                mech.demote(d)
            case Cancel():
                mech.cancel(d)
            case _:
                raise ValueError(f"unknown decision {d!r}")
