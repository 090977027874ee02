"""Periodic checkpoints (``run.checkpoint_interval`` seconds): a run made of parts.

A periodic checkpoint is the checkpoint of a run's end (``pserver.ckpt.drivers.end``) followed by
a resume in the same process: every learner pauses at its first step boundary once
``run.checkpoint_interval`` seconds have passed since its part began (``Trainer.pause_at``),
exactly as it stops for SIGTERM (its pushes delivered, the answers to its last pulls collected,
a goodbye to its shards, its prefetcher's goodbye with the minibatches it computed on); every
other role's loop then ends as at a run's end. Every rank writes its file of generation g, the
ranks agree, the statistics rank commits g (``LATEST``), and each rank builds its driver again
from the state it just wrote (:func:`continued`: the next part's resume, ``continued=True``), which
is what ``--resume`` from generation g would build. So the cut is the one the end and signal
checkpoints already take, ``--resume`` accepts a periodic generation as it accepts theirs, and
with λ = 1 the run with periodic checkpoints, the same run without them and a run resumed from
any of its generations end with the same weights, bit for bit (tests/test_mpi_periodic.py).

The moment: each learner reads the clock itself (no message decides it). Learners pause within
about one step of each other; a learner that paused first retires from its shards' rounds with
its goodbye (``Rounds.retire``), so the others finish their step and reach their own boundary,
past the same time, and pause too. With λ > 1 under hardsync or softsync the round open at
the pause closes with the gradients that arrived, as at a signal (docs/checkpoints.md): the
bits then differ from a run without checkpoints, not the accuracy.

A generation that cannot be written (a full disk) or committed: one ``pserver-run: warning:``
line from the statistics rank, the previous generation stays ``LATEST``, and training goes on
from the state in memory (the next generation is tried one interval later). A signal during a
part wins: the run ends with exit 75 as without periodic checkpoints.

Liveness: a part ends on every rank because every learner reaches a step boundary or the
run's end (a learner waiting in a pull is answered once the learners that paused retired from
the round it waits for, and SSP's bound releases the pulls it held for them; under the
iteration rule of partial pulling it leaves its pull once its own pause is due instead,
``pserver.ckpt.records.partial_pull``), after which the
roles' loops end as at any run's end; the write and agreement are those of
``pserver.ckpt.drivers.end`` (every rank reports, even one that failed to write; every wait
through ``Waiter`` with back-off and a stall report). Each part makes progress: it runs at least
one step boundary per learner and ``pause_at`` is measured from the part's start, so a pause
never follows another without an interval of training in between. No rank spins: the pause is
the end of a part, where ranks wait in the agreement's ``Waiter``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from pserver.ckpt.drivers.end import CONTINUE, Checkpointed, end_checkpoint, generation
from pserver.ckpt.files import CheckpointError, Manifest, State
from pserver.ckpt.resume import Resume, checkpoint_dir

if TYPE_CHECKING:
    from mpi4py import MPI

    from pserver.runtime.context import Context


def run_parts(ctx: Context, world: MPI.Comm, build: Callable[[Context], Checkpointed]) -> int:
    """Run the role's driver (``build(ctx)`` makes one) part after part until the run ends,
    checkpointing after each; the exit status of the last (``ckpt_end``). Each part's driver
    gets its own frozen context: the first ``ctx``, then ``ctx`` with the state the last part
    wrote as its resume (:func:`continued`), passed, never written into a context."""
    gen = generation(ctx)
    part, last = ctx, None
    while True:
        driver = build(part)
        driver.run()
        code, state = end_checkpoint(part, world, driver, gen)
        if code != CONTINUE:
            return code
        last = state if state is not None else last  # a state that failed: the last one's
        if last is None:
            raise CheckpointError(f"rank {ctx.rank}: no state to continue from")
        part = ctx.resumed(continued(part, gen, last))
        gen += 1


def continued(ctx: Context, gen: int, state: State) -> Resume:
    """The in-process resume from generation ``gen``: this rank's state as it wrote it (or
    tried to), the restarts counted so far, the clock going on."""
    restarts = ctx.resume.restarts if ctx.resume is not None else 0
    manifest = Manifest(
        gen, ctx.layout.world_size, time.time(), ctx.cfg.to_dict(),
        {"restarts": restarts, "elapsed": ctx.now()},
    )  # fmt: skip
    return Resume(checkpoint_dir(ctx.cfg.run.out_dir).parent, manifest, state, continued=True)
