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
from dataclasses import dataclass
from typing import Any

from pserver.ckpt.files import CheckpointError, State, attr, counts
from pserver.protocols.lockstep import DataQuota


@dataclass(frozen=True)
class QuotaRecord:
    """The quota's record: its kind and, per learner index, the minibatches it computed on.
    On disk: the data server's ``quota`` attribute, ``{"kind": str, "computed": {"i": n}}``."""

    kind: str
    computed: dict[int, int]

    def to_state(self) -> State:
        computed = {str(i): int(n) for i, n in sorted(self.computed.items())}
        return State({}, {"kind": self.kind, "computed": computed})

    @classmethod
    def from_state(cls, saved: State, where: str = "checkpoint") -> QuotaRecord:
        """The record of the ``quota`` attribute, refused (:class:`CheckpointError` naming the
        field) unless the kind is a string and every count an integer >= 0 of a learner index;
        ``computed`` may be a list of counts (the index is the position)."""
        a = saved.attrs
        kind = attr(a, "kind", str, where)
        computed = counts(a, "computed", where)
        items = computed.items() if isinstance(computed, dict) else enumerate(computed)
        out = {}
        for key, n in items:
            if not str(key).isdigit():
                raise CheckpointError(f"{where}: the quota names learner {key!r}, not an index")
            out[int(key)] = int(n)
        return cls(kind, out)


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
    return QuotaRecord(quota.kind, computed).to_state().attrs


def restore_quota(quota: DataQuota, attrs: Mapping[str, Any], where: str = "checkpoint") -> None:
    """The counts a resumed run's quota starts from (``attrs``: the ``quota`` attribute)."""
    quota.served = dict(QuotaRecord.from_state(State({}, dict(attrs)), where).computed)


def check_quota(attrs: Mapping[str, Any], where: str) -> None:
    """Refuse, before training, a saved quota whose types or counts :func:`restore_quota` could
    not take (issue 22, D4): a kind that is not a string, a count that is not an integer >= 0,
    or a learner index that is not an integer."""
    QuotaRecord.from_state(State({}, attr(attrs, "quota", dict, where)), where)
