"""The layout in one plain line, logged by rank 0 at start (pure).

``layout: hardsync, λ = 4 learners (ranks 3-6), 1 shard (rank 0), stats rank 1, data rank 2``:
the learner count λ is what two runs meant to compare must share, and the same ``mpiexec -n``
gives a different λ under a strategy with shards than under one without (issue 25), so it
comes first; a per-rank table is left to the debug log.
"""

from __future__ import annotations

from collections.abc import Sequence

from pserver.plan.topology import Layout


def ranks(members: Sequence[int]) -> str:
    """``(3, 4, 5, 6, 9)`` -> ``"3-6, 9"``: consecutive ranks as one range."""
    runs: list[list[int]] = []
    for r in sorted(members):
        if runs and r == runs[-1][-1] + 1:
            runs[-1].append(r)
        else:
            runs.append([r])
    return ", ".join(f"{g[0]}-{g[-1]}" if len(g) > 1 else f"{g[0]}" for g in runs)


def counted(n: int, one: str, many: str, members: Sequence[int]) -> str:
    """``"4 learners (ranks 3-6)"``, ``"1 shard (rank 0)"``."""
    word = "rank" if n == 1 else "ranks"
    return f"{n} {one if n == 1 else many} ({word} {ranks(members)})"


def layout_line(layout: Layout, protocol: str, tree_fanout: int = 0, bcast_fanout: int = 0) -> str:
    """One line: the strategy, λ and which ranks are learners, shards, aggregators, stats, data."""
    lam = len(layout.learners)
    parts = [f"λ = {counted(lam, 'learner', 'learners', layout.learners)}"]
    if layout.servers:
        parts.append(counted(len(layout.servers), "shard", "shards", layout.servers))
    else:
        parts.append("no shard")
    if layout.aggregators:
        n = len(layout.aggregators)
        agg = counted(n, "aggregator", "aggregators", layout.aggregators)
        parts.append(f"{agg[:-1]}; tree fan-out {tree_fanout})")
    parts += [f"stats rank {layout.stats}", f"data rank {layout.data}"]
    if bcast_fanout:
        parts.append(f"learner broadcast tree fan-out {bcast_fanout}")
    return f"layout: {protocol}, " + ", ".join(parts)
