"""What a rank does before anything else, so that its start and CPU share do not depend on
which MPI launched it: a session of its own, as MPICH's launcher gives it (:func:`own_session`),
and Open MPI's start without its slowest probe (:func:`mpi_defaults`); h5py's import
without a ``uname -p`` child process (:func:`uname_without_fork`); and whether a rank may
finalize MPI itself at its end (:func:`alone`).

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
import threading
from collections.abc import Mapping, MutableMapping

#: variables a launcher sets in every rank's environment (Open MPI/PMIx, MPICH/PMI, Slurm)
LAUNCHED = ("PMIX_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID")
#: what Open MPI's launcher (or a PMIx one, e.g. srun --mpi=pmix) sets in a rank's environment
OPEN_MPI_LAUNCHED = ("OMPI_COMM_WORLD_RANK", "PMIX_RANK")
#: Open MPI settings a rank takes unless its environment already sets them (mpi_defaults)
OPEN_MPI_DEFAULTS = {
    # the libfabric BTL probes its providers at MPI_Init for about a second, even on one node
    # (docs/performance.md, *Open MPI and MPICH*); libfabric networks are driven through the
    # ofi MTL (pml cm), which stays, and pserver's one-sided windows are shared memory
    "OMPI_MCA_btl": "^ofi",
}


def launched(environ: Mapping[str, str] | None = None) -> bool:
    """Whether this process is a rank started by a launcher (its environment says so)."""
    env = os.environ if environ is None else environ
    return any(k in env for k in LAUNCHED)


def own_session(environ: Mapping[str, str] | None = None) -> bool:
    """Make this rank a session (and autogroup) of its own; True if it now is one.

    Nothing is changed for a process not started by a launcher, one that reads a terminal
    (e.g. an interactive Python inside ``srun --pty``: its terminal's Ctrl-C must still reach
    it; a launcher gives its ranks a pipe or /dev/null) or one that already leads its session.
    """
    if not hasattr(os, "setsid") or not launched(environ) or _on_terminal():
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


def mpi_defaults(environ: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """Set :data:`OPEN_MPI_DEFAULTS` that this rank's environment leaves unset (before
    ``MPI_Init``, which reads them); the ones set. MPICH ignores these variables; a user's
    own ``OMPI_MCA_btl`` (or ``mpiexec --mca btl …``, which reaches the rank as the same
    variable) wins."""
    env = os.environ if environ is None else environ
    if not any(k in env for k in OPEN_MPI_LAUNCHED):  # MPICH's Hydra sets PMI_RANK only
        return {}
    chosen = {k: v for k, v in OPEN_MPI_DEFAULTS.items() if k not in env}
    env.update(chosen)
    return chosen


def uname_without_fork() -> None:
    """Let ``platform.uname()[i]`` for the five fields of ``uname(2)`` (system … machine) be
    read without computing the sixth, ``processor``, which Python gets on Linux by running
    ``uname -p`` in a child process.

    Importing h5py reads ``platform.uname()[4]`` (the machine), and a ``uname_result``'s
    ``__getitem__`` builds the whole tuple first, so every rank that imports h5py (the
    statistics server at start, every rank at its end checkpoint) forked a process for a field
    it never reads (docs/performance.md, *A job's start-up*, has the cost).
    The values are unchanged; ``processor``, a slice or a negative index is still computed as
    Python does."""
    import platform  # here, not above: own_session runs before anything it need not wait for

    result = getattr(platform, "uname_result", None)
    full = getattr(result, "__getitem__", None)
    if result is None or full is None or getattr(full, "_pserver", False):
        return
    base = result.__mro__[1]  # the namedtuple of the five uname(2) fields
    if getattr(base, "_fields", None) != ("system", "node", "release", "version", "machine"):
        return  # another Python's layout: leave it alone

    def getitem(self: object, key: object) -> object:
        if isinstance(key, int) and 0 <= key < len(base._fields):
            return base.__getitem__(self, key)
        return full(self, key)

    getitem._pserver = True  # type: ignore[attr-defined]
    result.__getitem__ = getitem


def alone(environ: Mapping[str, str] | None = None) -> bool:
    """Whether this is a launched rank whose main thread is its only thread: it may finalize
    MPI itself before Python's exit (no other thread could still call MPI), which times
    ``MPI_Finalize`` as a phase of its own (``pserver.job.cli.main``).

    Ending such a rank with ``os._exit`` right after ``MPI_Finalize``, which would save the
    interpreter's teardown, made MPICH's Hydra kill the ranks still finalizing (exit 9): the
    launcher saw a rank's exit before its finalize; not done (docs/performance.md, *A job's
    start-up*, has the measurements)."""
    main = threading.main_thread()
    others = [t for t in threading.enumerate() if t is not main and t.is_alive()]
    return launched(environ) and not others
