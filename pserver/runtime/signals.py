"""SIGTERM / SIGINT: ask the run to stop at its next consistent point and checkpoint.

The handler only records the signal (no MPI, no I/O in a handler: it runs between two Python
bytecodes of whatever the main thread was doing). Learners look at :data:`STOP` at every step
boundary (``pserver.roles.trainer``): a learner that sees it computes nothing more, delivers
its pushes and says goodbye as at the end of a run; the shards end once every learner did, and
every rank then writes its checkpoint (``pserver.ckpt.drivers.end``). The handler puts the
default action back at once, so a second SIGTERM or SIGINT ends the rank immediately.

Hydra's ``mpiexec`` forwards SIGTERM (and Ctrl-C's SIGINT) to every rank, and under SLURM
slurmd signals every rank of a step (``scancel``, a requeue; ``srun`` itself turns a SIGTERM
it gets into SIGKILL for its tasks, so ``scripts/pserver.slurm`` signals them through
``scancel --signal=TERM``), so every learner sees it; a signal that reaches only some learners
still ends the run, since the shards end when their last learner has said goodbye.
"""

from __future__ import annotations

import signal
from types import FrameType

SIGNALS = (signal.SIGTERM, signal.SIGINT)
# the exit status of a run stopped by a signal after its checkpoint: resume it (sysexits'
# EX_TEMPFAIL, "try again later"; 3 is a dump that cannot be written, 1 a failure)
STOPPED = 75


class StopRequest:
    """Whether (and by which signal) this rank was asked to stop."""

    def __init__(self) -> None:
        self.signum: int | None = None

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def install(self) -> None:
        """Catch the first SIGTERM or SIGINT (main thread only, as Python requires)."""
        for s in SIGNALS:
            signal.signal(s, self.handler)

    def handler(self, signum: int, frame: FrameType | None) -> None:
        self.signum = signum
        for s in SIGNALS:  # a second signal takes the default action: the rank ends now
            signal.signal(s, signal.SIG_DFL)

    def reset(self) -> None:
        self.signum = None


#: The one stop request of this process.
STOP = StopRequest()
