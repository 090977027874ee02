"""A shard block's checkpoint: what :class:`~pserver.protocols.shard_block.ShardBlock` holds
between two
rounds, as host arrays and JSON attributes, and back. Pure: no MPI.

Saved: the weights, the update rule's state arrays (``Updater.state_arrays``: momentum's
velocity, AdaGrad's sums), the timestamp, the gradients applied and dropped, and the epoch
counter; the epochs left to train and whether the block is done follow from these and the
resumed run's ``run.epochs``, so a finished run can be continued for more epochs.

The cut is taken once every learner has delivered its pushes and said goodbye
(``pserver.ckpt.drivers.end``): no gradient is on its way. A round still open there (λ > 1:
fewer than the round's gradients arrived) is not saved; its gradients are counted in the
``open_round`` attribute and the resumed block starts a fresh round. Protocol state (SSP's
clocks, PSP's deadlines) restarts level too, unless the protocol offers ``state()`` /
``restore()`` (the hook a protocol with state worth keeping fills); hardsync's and PSP's round
accounting keeps the largest iteration tag each learner pushed (``attrs["rounds"]``, what the
iteration rule's liveness needs across a resume: ``pserver.ckpt.records.partial_pull``). PP-ASGD's
predictor
(``protocol.predict``) is saved whole: ``pserver.ckpt.records.prediction``. With λ = 1 nothing is
lost: every round is one gradient, so the resumed run repeats the uninterrupted one bit for
bit (tests/test_mpi_checkpoint.py).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pserver.ckpt.records.partial_pull import restore_rounds, rounds_state
from pserver.ckpt.records.prediction import predictor_arrays, predictor_state, restore_predictor
from pserver.protocols.shard_block import ShardBlock


def block_state(b: ShardBlock, index: int, to_host: Any) -> tuple[dict[str, np.ndarray], dict]:
    """``(arrays, attrs)`` of block ``index``; ``to_host(a)`` copies a backend array to numpy."""
    arrays = {f"w{index}": to_host(b.w)}
    for name, a in b.updater.state_arrays().items():
        arrays[f"opt{index}.{name}"] = to_host(a)
    attrs: dict[str, Any] = {
        "ts": b.ts,
        "applied": b.applied,
        "dropped": b.dropped,
        "next_epoch": b.epochs.next_epoch,
        "open_round": b.in_round,
    }
    save = getattr(b.protocol, "state", None)
    if callable(save):
        attrs["protocol"] = save()
    rounds = getattr(b.protocol, "rounds", None)
    # hardsync, psp: each learner's response (pserver.ckpt.records.partial_pull)
    if rounds is not None:
        attrs["rounds"] = rounds_state(rounds)
    if b.predictor is not None:  # PP-ASGD: S̄, the last rate and S, the probe in flight
        more, attrs["predictor"] = predictor_state(b.predictor, index, to_host)
        arrays.update(more)
    return arrays, attrs


def restore_block(
    b: ShardBlock, index: int, arrays: dict[str, np.ndarray], attrs: dict, copy_in: Any
) -> None:
    """Put block ``index``'s saved state into ``b`` (built fresh from the resumed config);
    ``copy_in(host, out)`` copies a numpy array into a backend array."""
    copy_in(arrays[f"w{index}"], b.w)
    for name, a in b.updater.state_arrays().items():
        copy_in(arrays[f"opt{index}.{name}"], a)
    b.ts, b.applied, b.dropped = int(attrs["ts"]), int(attrs["applied"]), int(attrs["dropped"])
    b.epochs.next_epoch = int(attrs["next_epoch"])
    b.in_round, b.held = 0, None
    b.done = b.epochs.samples(b.applied, b.dropped) >= b.epochs.total_samples
    load = getattr(b.protocol, "restore", None)
    if callable(load) and "protocol" in attrs:
        load(attrs["protocol"])
    rounds = getattr(b.protocol, "rounds", None)
    if rounds is not None and "rounds" in attrs:
        restore_rounds(rounds, attrs["rounds"], b.ts)
    if b.predictor is not None:
        restore_predictor(b.predictor, index, arrays, attrs["predictor"], copy_in)
    after = getattr(b, "restored", None)  # a block serving another model than w (BMUF's)
    if callable(after):
        after()


def expected_arrays(b: ShardBlock, index: int) -> dict[str, tuple[tuple[int, ...], str]]:
    """Name -> (shape, dtype) of every array :func:`block_state` writes for ``b``."""
    out = {f"w{index}": (tuple(b.w.shape), str(b.w.dtype))}
    for name, a in b.updater.state_arrays().items():
        out[f"opt{index}.{name}"] = (tuple(a.shape), str(a.dtype))
    if b.predictor is not None:
        out.update(predictor_arrays(b.predictor, index))
    return out
