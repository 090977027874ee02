"""What produced a run: code version and commit, library versions, the MPI library, the launch,
and every rank's role, host, node-local rank and tree parent.

Recorded in the dump's root attributes (``docs/stats.md``, *Root attributes*) by the statistics
server and said at start-up by rank 0 in one line per host (:func:`host_lines`), so a dump
found months later says which code, libraries and machines made it. Everything here is read
once at start-up; the git commit comes from the checkout the ``pserver`` package was imported
from (none when it was installed from a wheel).

Pure but for :func:`library_versions` and :func:`git_commit` (subprocess, bounded).
"""

from __future__ import annotations

import os
import platform
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

GIT_TIMEOUT = 5.0  # s; a hung git (a network file system) must not hold up the start
SLURM_VARS = ("SLURM_JOB_ID", "SLURM_STEP_ID", "SLURM_RESTART_COUNT", "SLURM_JOB_NODELIST",
              "SLURM_NTASKS", "SLURM_CLUSTER_NAME")


@dataclass(frozen=True)
class RankInfo:
    """One rank as the dump's ``ranks`` attribute lists it."""

    rank: int
    role: str  # "server 0", "learner 3", ... (Layout.describe)
    host: str
    local_rank: int  # its index among the ranks of its node
    parent: int  # the rank it sends to in a tree (aggregator, or learner it pulls from); -1: none
    pid: int = -1  # its process id on its host (-1: not known)


def rank_table(
    layout: Any, nodes: Sequence[int], hosts: Sequence[str], pids: Sequence[int] = ()
) -> list[RankInfo]:
    """Every rank's :class:`RankInfo`; ``nodes`` the node of every rank (its lowest rank),
    ``pids`` its process id (none known where empty)."""
    seen: dict[int, int] = {}
    out = []
    for r in range(layout.world_size):
        local = seen.get(nodes[r], 0)
        seen[nodes[r]] = local + 1
        parent = layout.parent.get(r, layout.bcast_parent.get(r, -1))
        pid = pids[r] if pids else -1
        out.append(RankInfo(r, layout.describe(r), hosts[r], local, parent, pid))
    return out


def host_lines(table: Sequence[RankInfo]) -> list[str]:
    """One line per host: ``host HOST: N ranks: 0 server 0 (pid 812), 1 stats server (pid 813),
    4 learner 1 (parent 3, pid 816)`` (a PID where known)."""
    by_host: dict[str, list[RankInfo]] = {}
    for info in table:
        by_host.setdefault(info.host, []).append(info)
    lines = []
    for host, ranks in by_host.items():
        parts = []
        for i in ranks:
            notes = ([f"parent {i.parent}"] if i.parent >= 0 else []) + (
                [f"pid {i.pid}"] if i.pid >= 0 else []
            )
            parts.append(f"{i.rank} {i.role}" + (f" ({', '.join(notes)})" if notes else ""))
        count = f"{len(ranks)} rank{'s' if len(ranks) > 1 else ''}"
        lines.append(f"host {host}: {count}: {', '.join(parts)}")
    return lines


def library_versions() -> dict[str, str]:
    """pserver, Python, numpy, mpi4py and h5py versions, and the MPI library's own line."""
    import h5py
    import mpi4py
    import numpy as np
    from mpi4py import MPI

    from pserver import __version__

    return {
        "pserver": __version__,
        "python": platform.python_version(),
        "numpy": np.__version__,
        "mpi4py": mpi4py.__version__,
        "h5py": h5py.__version__,
        "hdf5": h5py.version.hdf5_version,
        "mpi": mpi_library(MPI.Get_library_version()),
    }


def mpi_library(text: str) -> str:
    """The first line of ``MPI_Get_library_version`` (MPICH prints a dozen of build options),
    printable characters only (Open MPI's ends in a NUL, which HDF5 strings cannot hold)."""
    text = "".join(c for c in text if c.isprintable() or c == "\n")
    lines = [" ".join(ln.split()) for ln in text.splitlines() if ln.strip()]
    return lines[0] if lines else "unknown"


def git_commit(where: Path | None = None) -> str:
    """``HEAD``'s commit of the checkout holding ``where`` (default: this package), with
    ``-dirty`` when tracked files differ from it; "" outside a checkout or without git."""
    where = where or Path(__file__).resolve().parent
    try:
        head = _git(where, "rev-parse", "HEAD")
        dirty = _git(where, "status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return ""
    return head + ("-dirty" if dirty else "") if head else ""


def _git(where: Path, *args: str) -> str:
    res = subprocess.run(
        # --no-optional-locks: ``git status`` would otherwise take the checkout's index.lock to
        # refresh the index, and a job killed meanwhile (scancel, a test's timeout) left it
        # behind, breaking the user's next git command in that checkout
        ["git", "--no-optional-locks", "-C", str(where), *args], capture_output=True, text=True,
        timeout=GIT_TIMEOUT, check=True,
    )  # fmt: skip
    return res.stdout.strip()


def launch_info(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The SLURM variables of this launch that are set (job, step, restarts, nodes)."""
    env = os.environ if environ is None else environ
    return {v: env[v] for v in SLURM_VARS if env.get(v)}


def restarts(environ: Mapping[str, str] | None = None) -> int:
    """How often SLURM restarted this job (requeue, preemption): ``$SLURM_RESTART_COUNT``."""
    env = os.environ if environ is None else environ
    try:
        return max(0, int(env.get("SLURM_RESTART_COUNT", "0") or 0))
    except ValueError:
        return 0


def dump_attrs(
    layout: Any, nodes: Sequence[int], hosts: Sequence[str], run_dir: str,
    pids: Sequence[int] = (),
) -> dict[str, Any]:
    """The dump's provenance attributes (``docs/stats.md``, *Root attributes*)."""
    versions = library_versions()
    hosts = list(hosts) or ["?"] * layout.world_size
    nodes = list(nodes) or [0] * layout.world_size
    return {
        "git_commit": git_commit(),
        "versions": versions,
        "mpi_library": versions["mpi"],
        "ranks": [asdict(i) for i in rank_table(layout, nodes, hosts, pids)],
        "run_dir": run_dir,
        "launch": launch_info(),
        "restarts": restarts(),
    }
