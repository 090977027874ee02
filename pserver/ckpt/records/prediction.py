"""PP-ASGD's prediction state in a shard block's checkpoint (``pserver.ckpt.records.shard``), and
back.
Pure: no MPI.

What a :class:`~pserver.optim.prediction.Predictor` holds between two updates, all of which the next
pull's f_S(w, M) (Sato et al. eq. (2)) and the dump's ``predictions`` / ``prediction_errors``
rows depend on:

* the running mean S̄ (:class:`~pserver.optim.prediction.StalenessMean`): the last ``WINDOW``
  updates' ⟨σ⟩, as JSON floats (``repr`` round-trips a float exactly); its sum is re-summed
  from them on restore, as :meth:`StalenessMean.add` does after every update;
* the rate α of the last update and the S served with it: the first pull after a resume is
  answered with f_S(w_t, M_t) of the restored w_t and velocity, exactly the model the
  uninterrupted run served at that timestamp (a fresh predictor has α = 0 and would serve w);
* the error probe in flight (:class:`~pserver.optim.prediction.ErrorProbe`): its origin, S and due
  timestamp, and its two float64 buffers w_t and M_t (``pred{index}.w0``, ``pred{index}.m0``),
  so a probe cut by the checkpoint ends at the same update as in the uninterrupted run.

The fixed S (``protocol.predict_steps``) and the probe interval are the config's, which a
resumed run may not change (``pserver.ckpt.files.MAY_CHANGE``).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from pserver.ckpt.files import CheckpointError, State, attr, counts
from pserver.optim.prediction import Predictor

if TYPE_CHECKING:
    from pserver.plan.config import Config
    from pserver.plan.topology import Block


def probe_arrays(index: int) -> tuple[str, str]:
    """Names of block ``index``'s probe buffers in the rank's checkpoint file."""
    return f"pred{index}.w0", f"pred{index}.m0"


KEYS = ("recent", "window", "lr", "steps", "probe")


@dataclass(frozen=True)
class PredictorRecord:
    """Block ``index``'s predictor (see the module). On disk: the block's ``predictor``
    attribute ``{"recent": [float], "window", "lr", "steps", "probe": [origin, steps, due]}``
    and, when the probe runs (``every`` > 0), the arrays ``pred{index}.w0`` and
    ``pred{index}.m0``."""

    index: int
    recent: tuple[float, ...]
    window: int
    lr: float
    steps: int
    probe: tuple[int, int, int]
    w0: np.ndarray | None = None  # the probe's buffers, None when no probe runs
    m0: np.ndarray | None = None

    def to_state(self) -> State:
        arrays: dict[str, np.ndarray] = {}
        if self.w0 is not None and self.m0 is not None:
            w0, m0 = probe_arrays(self.index)
            arrays = {w0: self.w0, m0: self.m0}
        attrs = {
            "recent": [float(x) for x in self.recent],
            "window": self.window,
            "lr": float(self.lr),
            "steps": int(self.steps),
            "probe": [int(x) for x in self.probe],
        }
        return State(arrays, attrs)

    @classmethod
    def from_state(
        cls, saved: State, index: int, probed: bool, where: str = "checkpoint"
    ) -> PredictorRecord:
        """Block ``index``'s record in ``saved`` (its arrays and the ``predictor`` attribute),
        with the probe's buffers when ``probed``; refused (:class:`CheckpointError` naming the
        field) where a type or a range is wrong or a buffer is missing (issue 22, D4)."""
        a, at = saved.attrs, f"{where} block {index} predictor"
        window = attr(a, "window", int, at, 1)
        recent = attr(a, "recent", list, at)
        if len(recent) > window:
            raise CheckpointError(f"{at}: {len(recent)} recent values for a window of {window}")
        for i, v in enumerate(recent):
            attr({f"recent[{i}]": v}, f"recent[{i}]", float, at)
        lr = attr(a, "lr", float, at, 0)
        steps = attr(a, "steps", int, at, 0)
        probe = attr(a, "probe", list, at)
        if len(probe) != 3:
            raise CheckpointError(f"{at}: 'probe' is {probe!r}, expected [origin, steps, due]")
        counts(a, "probe", at, -1)  # -1: no probe under way
        w0 = m0 = None
        if probed:
            names = probe_arrays(index)
            missing = [n for n in names if n not in saved.arrays]
            if missing:
                raise CheckpointError(f"{where}: the checkpoint lacks the probe's {missing[0]!r}")
            w0, m0 = (saved.arrays[n] for n in names)
        origin, n, due = (int(x) for x in probe)
        return cls(index, tuple(float(x) for x in recent), window, float(lr), int(steps),
                   (origin, n, due), w0, m0)  # fmt: skip


def predictor_record(p: Predictor, index: int, to_host: Any) -> PredictorRecord:
    """Block ``index``'s predictor as a record; ``to_host(a)`` copies to numpy."""
    probe = p.probe
    w0 = m0 = None
    if probe.every:  # the buffers exist (allocated once) whether a probe runs or not
        w0, m0 = to_host(probe.w0), to_host(probe.m0)
    return PredictorRecord(
        index, tuple(p.mean.recent), int(p.mean.recent.maxlen or 0), float(p.lr), int(p.steps),
        (int(probe.origin), int(probe.steps), int(probe.due)), w0, m0,
    )  # fmt: skip


def put_predictor(p: Predictor, r: PredictorRecord, copy_in: Any) -> None:
    """Put the record ``r`` into ``p`` (built fresh from the same config); ``copy_in(host,
    out)`` copies a numpy array into a backend array."""
    p.mean.recent = deque(r.recent, maxlen=r.window)
    p.mean.total = float(sum(p.mean.recent))
    p.lr, p.steps = r.lr, r.steps
    probe = p.probe
    probe.origin, probe.steps, probe.due = r.probe
    if r.w0 is not None and r.m0 is not None:
        copy_in(r.w0, probe.w0)
        copy_in(r.m0, probe.m0)


def predictor_state(
    p: Predictor, index: int, to_host: Any
) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """``(arrays, attrs)`` of block ``index``'s predictor; ``to_host(a)`` copies to numpy."""
    state = predictor_record(p, index, to_host).to_state()
    return state.arrays, state.attrs


def restore_predictor(
    p: Predictor, index: int, arrays: dict[str, np.ndarray], attrs: dict[str, Any], copy_in: Any
) -> None:
    """Put block ``index``'s saved predictor into ``p`` (built fresh from the same config);
    ``copy_in(host, out)`` copies a numpy array into a backend array."""
    record = PredictorRecord.from_state(State(arrays, attrs), index, bool(p.probe.every))
    put_predictor(p, record, copy_in)


def predictor_arrays(p: Predictor, index: int) -> dict[str, tuple[tuple[int, ...], str]]:
    """Name -> (shape, dtype) of every array :func:`predictor_state` writes for ``p``."""
    if not p.probe.every:
        return {}
    w0, m0 = probe_arrays(index)
    return {
        name: (tuple(a.shape), str(a.dtype)) for name, a in ((w0, p.probe.w0), (m0, p.probe.m0))
    }


def check_predictor(cfg: Config, state: State, block: Block, where: str) -> None:
    """Refuse, before training, a shard's checkpoint without block ``block``'s predictor
    (``cfg.protocol.predict``), or with probe buffers of another shape or dtype."""
    saved = state.attrs.get("blocks", {}).get(str(block.index), {}).get("predictor")
    if not isinstance(saved, dict) or any(k not in saved for k in KEYS):
        raise CheckpointError(
            f"{where}: the checkpoint lacks block {block.index}'s prediction state "
            "(protocol.predict = true): it was written by a run without it"
        )
    # types and ranges first: restore_predictor trusts them (issue 22, D4)
    PredictorRecord.from_state(State({}, saved), block.index, False, where)
    if not cfg.protocol.predict_probe:
        return
    for name in probe_arrays(block.index):
        a = state.arrays.get(name)
        if a is None or tuple(a.shape) != (block.size,) or a.dtype != np.float64:
            got = "missing" if a is None else f"{a.dtype}{list(a.shape)}"
            raise CheckpointError(
                f"{where}: the prediction probe's {name!r} is {got} in the checkpoint, this "
                f"run needs float64[{block.size}]"
            )
