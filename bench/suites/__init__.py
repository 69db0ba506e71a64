"""The measurements of the issue, one module each; each returns a :class:`Section`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from ..env import BenchEnv
from ..results import Row
from ..sizes import Sizes

BACKENDS = ("postgresql", "sqlite")


@dataclass
class Context:
    env: BenchEnv
    sizes: Sizes
    backends: tuple[str, ...] = BACKENDS


@dataclass
class Section:
    """One measurement's part of the report."""

    name: str
    title: str
    method: str
    rows: list[Row] = field(default_factory=list)
    #: Extra Markdown after the table (e.g. a profile summary).
    extra: str = ""


Suite = Callable[[Context], Section]


def peer_classes(backend: str) -> list[type]:
    """The peer adapters that run on *backend*."""
    if backend == "postgresql":
        from ..peers.deferjob_peer import DeferjobPeer
        from ..peers.pgqueuer_peer import PgqueuerPeer
        from ..peers.procrastinate_peer import ProcrastinatePeer

        return [DeferjobPeer, ProcrastinatePeer, PgqueuerPeer]
    from ..peers.huey_peer import HueyFsyncPeer, HueyPeer

    return [HueyPeer, HueyFsyncPeer]
