"""The overlapped learner's pipeline in a checkpoint (``comm.mode`` thread | nonblocking).

An :class:`~pserver.roles.overlap.OverlapExchange` computes on a compute copy while its next
pull is in flight, so what its next minibatch computes on is not the shards' model but

* the compute copy ``w`` and the timestamps of its blocks (``have``),
* the answers that arrived in the communication buffer but are not installed yet (``comm``,
  ``arrived``, ``current``): at a cut the learner has collected the answers to its last pull
  requests (``OverlapExchange.done``), so no request is outstanding,
* the in-flight window's counts (``pushed``, ``covered``, ``acked``, ``answered``:
  :mod:`pserver.protocols.inflight`), which decide whether the next minibatch waits for such an
  answer,
* at a run's end, the pushes its shards dropped because they had stopped (async and
  n-softsync: the learner computes one more minibatch while the request that brings STOP
  travels, ``pserver.roles.server`` counts it in ``dropped_after_stop``). A shard reads a
  learner's headers in order and answers a request of any age at once (``oldest = 0``), so a
  push sent after the request a shard answered STOP reached it after its stop: dropped. The
  two gradient buffers still hold the last two pushes; these are saved with the timestamps
  they were pushed with (``drop{j}``).

Resume: the same state is put back, the requests answered STOP are sent again where they were
(before the dropped pushes they preceded), the dropped pushes are sent again
(``pserver.roles.overlap.OverlapExchange.resend``), and the next
minibatch follows the uninterrupted run's arithmetic: it installs the answer the uninterrupted
run would have installed and computes on the same copy. With λ = 1 the resumed run's weights
equal the uninterrupted run's bit for bit (tests/test_mpi_ckpt_overlap.py). Liveness is that of
the uninterrupted run at the same point (``pserver.protocols.inflight``, point 2): every live block
has an
answer not installed, a request sent again, or a request covering every push.

Limit: more than two dropped pushes per block (``comm.max_inflight`` > 3 with λ = 1) are not
in the gradient buffers any more; the older ones are not sent again (docs/checkpoints.md).
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from pserver.ckpt.files import CheckpointError, State, attr, counts, expect

if TYPE_CHECKING:
    from pserver.comm.backend import Backend
    from pserver.protocols.inflight import InflightWindow

#: what ``OverlapExchange.resend`` sends again: the blocks answered STOP, and the dropped
#: pushes as (push number, {block: timestamp}, gradient)
Replay = tuple[list[int], list[tuple[int, dict[int, int], np.ndarray]]]


class HasBackend(Protocol):
    @property
    def backend(self) -> Backend: ...


class PipelineLink(Protocol):
    """The learner's link to its shards, as far as the record reads it: the compute copy
    ``w`` and the buffer answers arrive in, ``w_comm``."""

    w: Any
    w_comm: Any


class PipelineOwner(Protocol):
    """What the pipeline record reads and writes of an overlapped learner's exchange
    (``pserver.roles.overlap.OverlapExchange`` is one)."""

    @property
    def side(self) -> HasBackend: ...
    @property
    def link(self) -> PipelineLink: ...
    @property
    def window(self) -> InflightWindow | None: ...
    @property
    def grads(self) -> list[Any]: ...  # the two gradient buffers
    @property
    def recent(self) -> deque[tuple[int, dict[int, int]]]: ...  # the last pushes' timestamps
    steps: int
    have: dict[int, int]  # block -> timestamp installed
    arrived: dict[int, int]  # block -> timestamp complete in w_comm
    current: set[int]  # blocks answered "yours is current"
    stopped: set[int]  # blocks answered STOP
    replay: Replay | None

PIPELINE = 1  # format of the pipeline attributes


def _ints(d: dict[Any, Any]) -> dict[str, int]:
    return {str(k): int(v) for k, v in d.items()}


def _keys(d: dict[str, Any]) -> dict[int, int]:
    return {int(k): int(v) for k, v in d.items()}


def dropped_pushes(ex: PipelineOwner) -> list[tuple[int, dict[int, int]]]:
    """(push number, {block: timestamp pushed with}) of the pushes the shards dropped at their
    stop, oldest first; only those still in the two gradient buffers (see the module)."""
    w = ex.window
    if w is None:  # hardsync, PSP: a learner waits for every answer, nothing follows a STOP
        return []
    out = []
    for p, sent in ex.recent:
        lost = {b: ts for b, ts in sent.items() if b in w.stopped and p >= w.covered[b]}
        if lost:
            out.append((p, lost))
    return out


def pipeline_state(ex: PipelineOwner) -> State:
    """The exchange's pipeline as arrays and JSON-able attributes."""
    host = ex.side.backend.to_host
    arrays: dict[str, np.ndarray] = {"w": host(ex.link.w).copy()}
    if ex.arrived:
        arrays["comm"] = host(ex.link.w_comm).copy()
    drops = []
    for j, (p, lost) in enumerate(dropped_pushes(ex)):
        arrays[f"drop{j}"] = host(ex.grads[p % 2]).copy()
        drops.append({"push": p, "ts": _ints(lost)})
    attrs: dict[str, Any] = {
        "steps": ex.steps,
        "pipeline": PIPELINE,
        "have": _ints(ex.have),
        "arrived": _ints(ex.arrived),
        "current": sorted(ex.current),
        "stopped": sorted(ex.stopped),
        "drops": drops,
    }
    w = ex.window
    if w is not None:
        attrs["window"] = {
            "pushed": w.pushed,
            "covered": _ints(w.covered),
            "acked": _ints(w.acked),
            "answered": _ints(w.answered),
        }
    return State(arrays, attrs)


def restore_pipeline(ex: PipelineOwner, state: State) -> None:
    """Put the pipeline back; ``ex.replay`` gets what ``resend`` sends before the first
    minibatch (the requests answered STOP and the dropped pushes)."""
    a = state.attrs
    copy_in = ex.side.backend.copy_from_host
    copy_in(state.arrays["w"], ex.link.w)
    ex.arrived.update(_keys(a["arrived"]))
    if ex.arrived:
        copy_in(state.arrays["comm"], ex.link.w_comm)
    ex.current.update(int(b) for b in a["current"])
    ex.have.update(_keys(a["have"]))
    w = ex.window
    if w is not None and "window" in a:
        s = a["window"]
        w.pushed = int(s["pushed"])
        w.covered.update(_keys(s["covered"]))
        w.acked.update(_keys(s["acked"]))
        w.answered.update(_keys(s["answered"]))
    drops = [
        (int(d["push"]), _keys(d["ts"]), state.arrays[f"drop{j}"])
        for j, d in enumerate(a.get("drops", []))
    ]
    ex.replay = ([int(b) for b in a.get("stopped", [])], drops)


def check_pipeline(
    state: State, n_params: int, dtype: Any, blocks: list[int], where: str
) -> None:
    """Refuse, before training, an overlapped learner's state that does not fit this run."""
    a = state.attrs.get("exchange", {})
    if "pipeline" not in a:
        return  # an older checkpoint: the first minibatch waits for the shards' model
    # types and ranges first: restore_pipeline trusts them (issue 22, D4)
    attr(a, "steps", int, where, 0)
    for name in ("have", "arrived", "current", "stopped"):
        counts(a, name, where)
    for j, d in enumerate(attr(a, "drops", list, where) if "drops" in a else []):
        attr({f"drops[{j}]": d}, f"drops[{j}]", dict, where)
        attr(d, "push", int, f"{where} drops[{j}]", 0)
        counts(d, "ts", f"{where} drops[{j}]")
    if "window" in a:
        window = attr(a, "window", dict, where)
        attr(window, "pushed", int, where, 0)
        for name in ("covered", "acked", "answered"):
            counts(window, name, where)
    names = ["w", *(["comm"] if a.get("arrived") else [])]
    names += [f"drop{j}" for j in range(len(a.get("drops", [])))]
    dtype = np.dtype(dtype)
    for name in names:
        expect(state, f"exchange.{name}", (n_params,), dtype, where)
    if sorted(int(b) for b in a.get("have", {})) != sorted(blocks):
        raise CheckpointError(
            f"{where}: the learner held blocks {sorted(int(b) for b in a.get('have', {}))}, "
            f"this run has blocks {sorted(blocks)} (blocks.count changed)"
        )
