"""PP-ASGD (Sato et al. 2017) in a simulation: the shard's real ``Predictor``, its ``predictions``
rows as a real shard writes them.

A predicting shard's block is the real one (``ShardBlock.build`` turns prediction on from the
registry: ``pserver.strategies.serving``, PP-ASGD's layer ``pserver.strategies.prediction``), so
after each update ``ShardBlock.apply`` hands the update's ⟨σ⟩ and rate to the block's own
``pserver.optim.prediction.Predictor``, which keeps the running mean S̄ of the last ``WINDOW``
updates and chooses the S the new weights are served with (S = ⌊S̄⌋, or the fixed
``protocol.predict_steps``). The simulation writes what the real shard writes of it
(``ShardRows.prediction``): one ``predictions`` row per update, (shard, timestamp, S, S̄).

What is not simulated, because it is arithmetic on parameters:

* f_S(w, M) itself (``Predictor.serve``): a pull's reply carries the same header, timestamp and
  payload size whether it holds w or its prediction, so the exchange and its times are the
  host strategy's; the real shard's one pass over the block per update to produce the
  prediction is not timed apart (a fit of a PP-ASGD run's dump takes it into the shard's
  handling of messages, ``sim.message_time``);
* the error probes (``prediction_errors/``, Fig. 3-right): dot products of weights. The
  simulated block's predictor is built with the probe off (``probe_every = 0``), so it never
  reads the stand-in weights; the dump has no ``prediction_errors`` rows.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pserver.protocols.shard_block import Applied, ShardBlock
from pserver.sim.rows import Rows, Table


class NoStepVelocity:
    """The update rule's place in a predicting stand-in block: no step is taken, and the
    velocity ``ShardBlock.velocity`` hands the predictor is a one-element zero the predictor
    does not read with its probe off (only ``Predictor.serve`` and the probe read it)."""

    def __init__(self) -> None:
        self.velocity = np.zeros(1)

    def step(self, w: Any, g: Any, lr: float) -> None:
        del w, g, lr

    def state_arrays(self) -> dict[str, Any]:
        return {"velocity": self.velocity}


class PredictionRows:
    """The ``predictions`` rows of one simulated shard (``ShardRows.prediction``)."""

    def __init__(self, rows: Rows, shard: int) -> None:
        self.shard = shard
        self.table: Table = rows.table("predictions", "shard", "timestamp", "steps",
                                       "staleness_mean")  # fmt: skip
        self.rows = rows

    def add(self, applied: Applied, block: ShardBlock) -> None:
        """After ``block.apply``: the S the new weights are served with and S̄, as the real
        shard writes them (only where the update predicts: ``applied.steps >= 0``)."""
        if applied.steps < 0 or block.predictor is None:
            return
        self.table.append((self.shard, applied.decision.new_timestamp, applied.steps,
                           block.predictor.mean.value))  # fmt: skip
        self.rows.check(self.table)


def predicting(block: ShardBlock, rows: Rows, shard: int) -> PredictionRows | None:
    """Prepare a simulated shard's block for PP-ASGD and return its rows' writer; None when the
    block does not predict (the registry said no). The block's predictor is rebuilt by the
    block's own ``predicting`` with the configured S and no error probe (see the module)."""
    p = block.predictor
    if p is None:
        return None
    block.updater = NoStepVelocity()
    block.predicting(p.fixed, 0)
    return PredictionRows(rows, shard)
