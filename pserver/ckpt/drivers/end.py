"""The checkpoint every rank writes when its role's loop has ended (run end or a signal).

The cut: a learner stops at a step boundary (the run is over, or ``pserver.runtime.signals`` asked),
delivers its pushes, collects the answers to its pull requests and says goodbye; a shard's loop
ends once every learner said goodbye, so no gradient is on its way and every shard's state is
that of the same moment for each learner. The data server ends when every learner's prefetcher
said goodbye (with the count of minibatches it computed on), the statistics server when every
rank did and its dump is published. Learners of SYNC, HYBRID, BMUF and MA stop at one step
boundary or block start they vote on (``pserver.roles.stop_vote``): every allreduce and block
round they started completes, and none is left waiting for a learner that stopped earlier.

Then every rank writes its own file of generation g (``pserver.ckpt.files.write_state``: atomic)
and reports to a non-blocking agreement (``startup.agree``, waited on with back-off); the
statistics server's rank commits generation g (the ``LATEST`` manifest) only when every rank
wrote its file, so a job killed at any moment keeps the previous generation valid.

Exit status of every rank (docs/checkpoints.md): 0 the run is over and checkpointed (it can be
continued for more epochs with ``--resume``); 75 (``signals.STOPPED``) stopped by a signal with
its checkpoint committed: resume it; 74 a checkpoint that could not be written (a full disk):
one line says why, and the previous generation stays the one to resume from. A periodic
checkpoint (a learner ``paused``: the ``PAUSED`` bit, no signal) returns :data:`CONTINUE`
instead, also when it could not be written (``pserver.ckpt.drivers.periodic`` goes on).

Liveness: every rank reaches the agreement once its loop ended (the loops end as at any run's
end); a rank that fails to write still reports (as a status), so none waits for it forever.
Time bound after a signal: the learners' current step (one minibatch and its exchange), the
answers to their last pulls, then one write of each rank's state (measured by
scripts/bench_checkpoint.py).
"""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, NamedTuple, Protocol

from pserver.ckpt.files import (
    CheckpointError,
    State,
    commit,
    discard_generation,
    generation_dir,
    latest,
    rank_file,
    write_state,
)
from pserver.ckpt.resume import checkpoint_dir, unsupported
from pserver.plan.topology import Role
from pserver.runtime.signals import STOPPED
from pserver.runtime.startup import agree_alive

if TYPE_CHECKING:
    from pathlib import Path

    import numpy as np
    from mpi4py import MPI

    from pserver.runtime.context import Context


class Checkpointed(Protocol):
    """What the end of a run reads of a role's driver: its run and its state. A driver that
    can stop early (a learner) or pause (a periodic checkpoint) also has ``stopped_early`` and
    ``paused``, read with a default of False (the other roles only follow them)."""

    def run(self) -> None: ...
    def state(self) -> State: ...


class Ending(NamedTuple):
    """How a part ended: the exit status (or :data:`CONTINUE`) and the state this rank wrote
    or tried to write (None when the driver could not give one)."""

    code: int
    state: State | None

WRITE_FAILED, STOPPED_EARLY = 1, 2  # bits of a rank's report
PAUSED = 4  # a learner paused for a periodic checkpoint (pserver.ckpt.drivers.periodic)
NOT_WRITTEN = 74  # exit status when the checkpoint could not be written (EX_IOERR)
CONTINUE = -1  # not an exit status: a periodic checkpoint was taken (or failed): train on


def generation(ctx: Context) -> int:
    """The generation this run writes: one past the one it resumed from, else one past what
    the directory holds (a run with ``run.overwrite`` over an older one), else 1."""
    if ctx.resume is not None:
        return ctx.resume.manifest.generation + 1
    try:
        old = latest(checkpoint_dir(ctx.cfg.run.out_dir))
    except CheckpointError:
        old = None
    return 1 if old is None else old.generation + 1


def end_checkpoint(
    ctx: Context, world: MPI.Comm, driver: Checkpointed, gen: int | None = None
) -> Ending:
    """Write this rank's state, agree, commit on the statistics rank; the exit status, or
    :data:`CONTINUE` after a periodic checkpoint (a learner paused, none was signalled), with
    the state written. ``gen``: the generation to write (default :func:`generation`)."""
    code, state = _end(ctx, world, driver, gen)
    return Ending(code, state)


def _end(
    ctx: Context, world: MPI.Comm, driver: Checkpointed, gen: int | None
) -> tuple[int, State | None]:
    stopped = bool(getattr(driver, "stopped_early", False))
    if unsupported(ctx.cfg) is not None:
        return 0, None
    root = checkpoint_dir(ctx.cfg.run.out_dir)
    gen = generation(ctx) if gen is None else gen
    started = time.perf_counter()
    report, error, size, state = 0, None, 0, None
    try:
        state = driver.state()
        size = write_state(rank_file(root, gen, ctx.rank), state.arrays, state.attrs)
    except (CheckpointError, OSError) as e:
        report, error = WRITE_FAILED, e
    if stopped:
        report |= STOPPED_EARLY
    if getattr(driver, "paused", False):
        report |= PAUSED
    ulfm = getattr(ctx.peers, "departures", None) is not None
    statuses, dead = agree_alive(world, report, ctx.waiter(), ulfm)
    if dead:  # lost learners (issue 22): a generation needs every rank's file
        return lost_not_committed(ctx, gen, dead), state
    code = STOPPED if (statuses & STOPPED_EARLY).any() else 0
    if code == 0 and (statuses & PAUSED).any():
        code = CONTINUE
    if error is not None and code == CONTINUE:
        ctx.log.warning("rank %d: %s", ctx.rank, error)  # the statistics rank's line follows
    elif error is not None:
        print(f"pserver-run: error: rank {ctx.rank}: {error}", file=sys.stderr, flush=True)
    failed = bool((statuses & WRITE_FAILED).any())
    if failed and ctx.role is Role.STATS:  # every rank has written or failed (the agreement)
        discard_generation(root, gen)
    if failed and code == CONTINUE:
        return periodic_not_written(ctx, gen, statuses), state
    if failed:
        if ctx.role is Role.STATS:
            print(
                f"pserver-run: error: checkpoint generation {gen} not committed (ranks "
                f"{[int(r) for r in (statuses & WRITE_FAILED).nonzero()[0]]} could not write "
                "theirs); the previous checkpoint is kept",
                file=sys.stderr,
                flush=True,
            )
        return NOT_WRITTEN, state
    ctx.log.debug("checkpoint generation %d: %d bytes written by this rank", gen, size)
    if ctx.role is Role.STATS:
        try:
            assert state is not None  # written, or the agreement said WRITE_FAILED
            extra = {
                "restarts": ctx.resume.restarts if ctx.resume is not None else 0,
                "elapsed": state.attrs["elapsed"],
                "stopped": code == STOPPED,
                "periodic": code == CONTINUE,
                "epochs_done": epochs_done(ctx.cfg.run.epochs, code, state.attrs),
            }
            commit(root, gen, ctx.layout.world_size, ctx.cfg.to_dict(), extra)
        except CheckpointError as e:
            if code == CONTINUE:
                return periodic_not_written(ctx, gen, statuses, str(e)), state
            print(f"pserver-run: error: {e}; the previous checkpoint is kept",
                  file=sys.stderr, flush=True)
            return NOT_WRITTEN, state
        log_cost(ctx, root, gen, time.perf_counter() - started, code)
    return code, state


def lost_not_committed(ctx: Context, gen: int, dead: list[int]) -> int:
    """A run that lost learners ends without a checkpoint (a generation holds every rank's
    state, and a resume the same λ): said once, and the run's own status stands (0)."""
    if ctx.role is Role.STATS:
        ctx.log.warning(
            "checkpoint generation %d not committed: ranks %s were lost during the run; "
            "the run itself finished (its dump is complete)", gen, dead,
        )
    return 0


def epochs_done(epochs: int, code: int, stats: dict) -> int:
    """The epochs a committed generation has done (``--resume`` refuses ``run.epochs`` at or
    below it): all of them for a run that ended well, else the last epoch tested or skipped
    by the statistics server (a lower bound with ``stats.test_every`` > 1: never refuses a
    part that would train)."""
    if code == 0:
        return int(epochs)
    return max([0, *stats.get("tested", []), *stats.get("skipped", [])])


def log_cost(ctx: Context, root: Path, gen: int, seconds: float, code: int) -> None:
    """One line per committed generation: its number, size and the seconds from this rank's
    write to the commit (the slowest rank's write and the agreement included)."""
    size = sum(p.stat().st_size for p in generation_dir(root, gen).glob("rank-*.h5"))
    why = {STOPPED: " (stopped by a signal: resume with --resume)", CONTINUE: " (periodic)"}
    ctx.log.info(
        "checkpoint generation %d committed in %s: %d bytes, written in %.3f s%s",
        gen, root, size, seconds, why.get(code, ""),
    )


def periodic_not_written(ctx: Context, gen: int, statuses: np.ndarray, why: str = "") -> int:
    """A periodic checkpoint that some rank could not write (or the statistics rank could not
    commit): one line, the previous generation stays ``LATEST``, training goes on."""
    if ctx.role is Role.STATS:
        ranks = [int(r) for r in (statuses & WRITE_FAILED).nonzero()[0]]
        cause = why or f"ranks {ranks} could not write theirs"
        print(
            f"pserver-run: warning: periodic checkpoint generation {gen} not committed "
            f"({cause}); the previous checkpoint is kept, training goes on",
            file=sys.stderr, flush=True,
        )
    return CONTINUE

