"""A session of its own for each rank, as MPICH's launcher gives it: the CPU share of a rank
on a shared machine must not depend on which MPI launched it.

Linux's scheduler shares the CPU between sessions first (autogroups,
``/proc/sys/kernel/sched_autogroup_enabled``), then between the processes of a session.
MPICH's Hydra starts every rank in a new session; Open MPI's ``prterun`` keeps all ranks in
the session of whoever called ``mpiexec`` (each rank leads its own process group). On a
machine that other users load, a 7-rank Open MPI job therefore got the CPU share of one
process where an MPICH job got seven: the same CPU time took several times the wall time,
and its waits woke late (docs/performance.md, *Open MPI and MPICH*, has the figures and
``scripts/bench_startup.py --openmpi`` measures them).

A rank that leads its process group cannot call ``setsid``; it first joins its parent's
group (same session, so allowed), then starts a session, whose group id is again its own
pid: a launcher that signals the rank or its group reaches it as before.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

#: variables a launcher sets in every rank's environment (Open MPI/PMIx, MPICH/PMI, Slurm)
LAUNCHED = ("PMIX_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID")


def own_session(environ: Mapping[str, str] | None = None) -> bool:
    """Make this rank a session (and autogroup) of its own; True if it now is one.

    Nothing is changed for a process not started by a launcher, one that reads a terminal
    (e.g. an interactive Python inside ``srun --pty``: its terminal's Ctrl-C must still reach
    it; a launcher gives its ranks a pipe or /dev/null) or one that already leads its session.
    """
    env = os.environ if environ is None else environ
    if not hasattr(os, "setsid") or not any(k in env for k in LAUNCHED) or _on_terminal():
        return False
    pid = os.getpid()
    if os.getsid(0) == pid:
        return True
    try:
        if os.getpgid(0) == pid:  # a group leader may not setsid: join the parent's group
            os.setpgid(0, os.getpgid(os.getppid()))
        os.setsid()
        return True
    except OSError:  # e.g. the parent in another session: stay as launched
        if os.getpgid(0) != pid:
            try:
                os.setpgid(0, 0)  # back to a group of its own, as the launcher made it
            except OSError:
                pass
        return False


def _on_terminal() -> bool:
    try:
        return os.isatty(0)
    except (OSError, ValueError):  # stdin closed
        return False
