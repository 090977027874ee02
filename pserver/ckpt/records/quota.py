"""The data server's quota of a learners-only run in a checkpoint (``pserver.protocols.lockstep``'s
``DataQuota``), and back. Pure: no MPI.

The quota counts, per learner, the minibatches it was served; a free-running run (ADPSGD)
stops serving once the count reaches M. At the cut, the minibatches served that a learner
never computed on (prefetched when it stopped) go back to the stream (the data server's
``replay``), so what is saved per learner is what it **computed on**: served minus those.
The resumed quota then serves the replayed minibatches first and stops at the same M, so the
run's learners compute on exactly M minibatches over all its parts, as the uninterrupted run.
A lockstep quota (SYNC, HYBRID) also needs the draws it took ahead, not saved here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from pserver.ckpt.files import CheckpointError, attr, counts
from pserver.protocols.lockstep import DataQuota


def quota_state(
    quota: DataQuota, served: Mapping[int, int], consumed: Mapping[int, int],
    index: Callable[[int], int],
) -> dict[str, Any]:  # fmt: skip
    """JSON attributes: ``served`` and ``consumed`` are this run's per learner **rank** (the
    data server's counts and the learners' goodbyes, -1: unknown), ``index`` maps a rank to
    its learner index (the quota's key)."""
    computed = dict(quota.served)
    for rank, n in served.items():
        done = consumed.get(rank, -1)
        if done >= 0:
            i = index(rank)
            computed[i] = computed.get(i, 0) - (n - done)
    return {"kind": quota.kind, "computed": {str(i): n for i, n in sorted(computed.items())}}


def restore_quota(quota: DataQuota, attrs: Mapping[str, Any]) -> None:
    """The counts a resumed run's quota starts from."""
    quota.served = {int(i): int(n) for i, n in attrs["computed"].items()}


def check_quota(attrs: Mapping[str, Any], where: str) -> None:
    """Refuse, before training, a saved quota whose types or counts :func:`restore_quota` could
    not take (issue 22, D4): a kind that is not a string, a count that is not an integer >= 0,
    or a learner index that is not an integer."""
    saved = attr(attrs, "quota", dict, where)
    attr(saved, "kind", str, where)
    computed = counts(saved, "computed", where)
    for key in computed:
        if not str(key).isdigit():
            raise CheckpointError(f"{where}: the quota names learner {key!r}, not an index")
