"""Will the run fit this node? Memory and size bounds checked before training.

Sizes in the config (``model.hidden``, ``data.n_samples``, ``model.size_mib``, ``data.prefetch``)
and in HDF5 files are not bounded by their types; without a check, a size too large for the
node ends in a ``MemoryError`` or ``OverflowError`` traceback after some ranks have started.
``prepare`` therefore estimates what every rank of this node will allocate, from the sizes
alone (nothing is allocated to find out), and compares the sum with the memory the node has
left (``MemAvailable``, or a smaller cgroup limit). The estimate is an upper bound of the
large arrays (below), not of Python's own few tens of MiB per rank: it refuses what cannot
fit, it does not promise that what passes will.

What each rank holds (P parameters of ``model.dtype``, N x F samples):

* the data server and the statistics server (the ranks that read the data; the others check
  only its shapes and dtypes): the dataset, while loading it: the file's array, its float32
  copy and the train/test split's copies (``data_bytes``);
* a learner: w, the communication buffer, the gradient and a staging buffer (4 P), the
  activations of one minibatch, and ``data.prefetch`` minibatch buffers;
* a server shard: w, the accumulator, up to two optimizer states and a staging buffer of its
  share of the blocks (5 P / S for S shards);
* an aggregator: 4 P; the statistics server: 2 P and the activations of a 1024-sample test
  batch; the data server: the dataset only.

On a GPU (``run.device`` gpu or auto) the model's copies live on the device, and only one
staging copy is counted on the host.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from pserver.errors import ConfigError

MAX_CLASSES = 1 << 24  # labels and data.n_classes: far above any real task, far below overflow
MAX_SIZE_MIB = float(1 << 30)  # model.size_mib: 1 PiB; beyond it, MiB -> bytes loses integers
MAX_POLL = 1.0  # comm.poll_max: the latency a wait may add to every message it waits for
TEST_BATCH = 1024  # samples the statistics server evaluates at a time (Model.evaluate)
MEMINFO = Path("/proc/meminfo")
CGROUP = Path("/sys/fs/cgroup")

COPIES = {"learner": 4, "server": 5, "aggregator": 4, "stats": 2, "data": 0}


def fmt(nbytes: float) -> str:
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20)):
        if nbytes >= size:
            return f"{nbytes / size:.1f} {unit}"
    return f"{nbytes / 2**10:.1f} KiB"


def available_memory(meminfo: Path = MEMINFO, cgroup: Path = CGROUP) -> int | None:
    """Bytes this node can still give: ``MemAvailable``, or the cgroup's limit left if lower
    (a batch job's allocation); None when neither can be read (then nothing is checked)."""
    free = None
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                free = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    if free is None and hasattr(os, "sysconf"):
        try:
            free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError):
            free = None
    left = cgroup_left(cgroup)
    if left is not None:
        free = left if free is None else min(free, left)
    return free


def cgroup_left(root: Path = CGROUP, self_cgroup: Path = Path("/proc/self/cgroup")) -> int | None:
    """``memory.max - memory.current`` of this process's cgroup (v2), None without a limit."""
    try:
        lines = self_cgroup.read_text().splitlines()
        rel = next(ln.split(":", 2)[2] for ln in lines if ln.startswith("0::"))
        group = root / rel.lstrip("/")
        limit = (group / "memory.max").read_text().strip()
        if limit == "max":
            return None
        return max(int(limit) - int((group / "memory.current").read_text()), 0)
    except (OSError, ValueError, StopIteration, IndexError):
        return None


def data_bytes(n: int, f: int, raw_itemsize: int, n_classes: int = 0) -> int:
    """Peak bytes one rank holds while loading N x F samples stored with ``raw_itemsize``
    bytes per value: the raw array, its float32 copy and the split's float32 copies, labels
    as int64 twice; ``n_classes`` x F float64 centroids for synthetic data."""
    return n * f * (raw_itemsize + 8) + 16 * n + 8 * n_classes * f


@dataclass(frozen=True)
class RunSizes:
    """The sizes that decide a rank's memory, once the model is built."""

    n_params: int
    itemsize: int
    activations: int  # bytes of one sample's forward and backward pass
    n_features: int
    batch_size: int
    prefetch: int
    on_gpu: bool
    n_servers: int = 1  # a shard holds its share of the blocks only
    # weight versions a shard or aggregator serves pulls from (pserver.protocols.versions):
    # comm.versions
    # when set; by default the pool may grow to 1 + readers but stays at 1-2 unless a reader
    # stalls, so the estimate counts 2 and docs/config.md says so
    versions: int = 2


    def rank_bytes(self, role: str) -> dict[str, int]:
        """The parts a rank of ``role`` holds, by what sets them."""
        copies = COPIES[role]
        if self.on_gpu and role in ("learner", "server", "aggregator"):
            copies = 1  # the model is on the device; one host staging copy
        params = -(-self.n_params // self.n_servers) if role == "server" else self.n_params
        parts = {"model": copies * params * self.itemsize}
        if role in ("server", "aggregator"):
            parts["model"] += (self.versions - 1) * params * self.itemsize
        if role == "learner":
            parts["activations"] = self.batch_size * self.activations
            parts["prefetch"] = self.prefetch * self.batch_size * (4 * self.n_features + 8)
        elif role == "stats":
            parts["activations"] = TEST_BATCH * self.activations
        return parts


class NodeBudget:
    """The memory of this rank's node and the roles of the ranks that share it."""

    def __init__(
        self, available: int | None, roles: list[str], rank: int, holders: list[str] | None = None
    ) -> None:
        """``holders``: the roles of this node's ranks that load the dataset (None: all)."""
        self.available, self.roles, self.rank = available, roles, rank
        self.holders = roles if holders is None else holders

    def check_data(self, per_rank: int, what: str) -> None:
        """``what`` names the keys or file that set ``per_rank`` bytes of data on every rank
        that loads it."""
        need = per_rank * len(self.holders)
        if self.available is not None and need > self.available:
            who = (
                f"every rank holds the dataset, so the {len(self.roles)} ranks"
                if self.holders is self.roles
                else f"the {' and '.join(self.holders)} server(s) load the dataset, so the "
                f"{len(self.holders)} of them"
            )
            raise ConfigError(
                f"{what}: {who} on the node of rank {self.rank} would need about {fmt(need)} "
                f"while loading it, but the node has {fmt(self.available)} available: use a "
                "smaller dataset, or fewer ranks per node"
            )

    def check_run(self, data_per_rank: int, sizes: RunSizes, keys: dict[str, str]) -> None:
        """Data plus every rank's model, activations and buffers; ``keys`` names, for each
        part ("model", "activations", "prefetch"), the config keys that set it."""
        if self.available is None:
            return
        parts = {"data": data_per_rank * len(self.holders)}
        for role in self.roles:
            for name, n in sizes.rank_bytes(role).items():
                parts[name] = parts.get(name, 0) + n
        need = sum(parts.values())
        if need <= self.available:
            return
        big = max(parts, key=lambda k: parts[k])
        raise ConfigError(
            f"{keys.get(big, big)}: the {len(self.roles)} ranks on the node of rank "
            f"{self.rank} would need about {fmt(need)}, of which {fmt(parts[big])} for the "
            f"{big}, but the node has {fmt(self.available)} available: make it smaller, or "
            "put fewer ranks on a node (docs/config.md, Memory)"
        )


def check_blas_threads(n: int, cores: int | None = None) -> None:
    """run.blas_threads: at most the node's cores (more threads per rank only compete)."""
    cores = os.cpu_count() if cores is None else cores
    if cores and n > cores:
        raise ConfigError(
            f"run.blas_threads = {n}: expected at most {cores}, the cores of this node "
            "(0: one per rank)"
        )
