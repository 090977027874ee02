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
from typing import TYPE_CHECKING, Any

import numpy as np

from pserver.optim.prediction import Predictor

if TYPE_CHECKING:
    from pserver.ckpt.files import State
    from pserver.plan.config import Config
    from pserver.plan.topology import Block


def probe_arrays(index: int) -> tuple[str, str]:
    """Names of block ``index``'s probe buffers in the rank's checkpoint file."""
    return f"pred{index}.w0", f"pred{index}.m0"


def predictor_state(
    p: Predictor, index: int, to_host: Any
) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """``(arrays, attrs)`` of block ``index``'s predictor; ``to_host(a)`` copies to numpy."""
    probe = p.probe
    arrays: dict[str, np.ndarray] = {}
    if probe.every:  # the buffers exist (allocated once) whether a probe runs or not
        w0, m0 = probe_arrays(index)
        arrays = {w0: to_host(probe.w0), m0: to_host(probe.m0)}
    attrs = {
        "recent": [float(x) for x in p.mean.recent],
        "window": p.mean.recent.maxlen,
        "lr": float(p.lr),
        "steps": int(p.steps),
        "probe": [int(probe.origin), int(probe.steps), int(probe.due)],
    }
    return arrays, attrs


def restore_predictor(
    p: Predictor, index: int, arrays: dict[str, np.ndarray], attrs: dict[str, Any], copy_in: Any
) -> None:
    """Put block ``index``'s saved predictor into ``p`` (built fresh from the same config);
    ``copy_in(host, out)`` copies a numpy array into a backend array."""
    p.mean.recent = deque((float(x) for x in attrs["recent"]), maxlen=int(attrs["window"]))
    p.mean.total = float(sum(p.mean.recent))
    p.lr, p.steps = float(attrs["lr"]), int(attrs["steps"])
    probe = p.probe
    probe.origin, probe.steps, probe.due = (int(x) for x in attrs["probe"])
    if probe.every:
        w0, m0 = probe_arrays(index)
        copy_in(arrays[w0], probe.w0)
        copy_in(arrays[m0], probe.m0)


def predictor_arrays(p: Predictor, index: int) -> dict[str, tuple[tuple[int, ...], str]]:
    """Name -> (shape, dtype) of every array :func:`predictor_state` writes for ``p``."""
    if not p.probe.every:
        return {}
    w0, m0 = probe_arrays(index)
    return {
        name: (tuple(a.shape), str(a.dtype)) for name, a in ((w0, p.probe.w0), (m0, p.probe.m0))
    }


KEYS = ("recent", "window", "lr", "steps", "probe")


def check_predictor(cfg: Config, state: State, block: Block, where: str) -> None:
    """Refuse, before training, a shard's checkpoint without block ``block``'s predictor
    (``cfg.protocol.predict``), or with probe buffers of another shape or dtype."""
    from pserver.ckpt.files import CheckpointError, attr, counts

    saved = state.attrs.get("blocks", {}).get(str(block.index), {}).get("predictor")
    if not isinstance(saved, dict) or any(k not in saved for k in KEYS):
        raise CheckpointError(
            f"{where}: the checkpoint lacks block {block.index}'s prediction state "
            "(protocol.predict = true): it was written by a run without it"
        )
    # types and ranges first: restore_predictor trusts them (issue 22, D4)
    at = f"{where} block {block.index} predictor"
    window = attr(saved, "window", int, at, 1)
    recent = attr(saved, "recent", list, at)
    if len(recent) > window:
        raise CheckpointError(f"{at}: {len(recent)} recent values for a window of {window}")
    for i, v in enumerate(recent):
        attr({f"recent[{i}]": v}, f"recent[{i}]", float, at)
    attr(saved, "lr", float, at, 0)
    attr(saved, "steps", int, at, 0)
    probe = attr(saved, "probe", list, at)
    if len(probe) != 3:
        raise CheckpointError(f"{at}: 'probe' is {probe!r}, expected [origin, steps, due]")
    counts(saved, "probe", at, -1)  # -1: no probe under way
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
