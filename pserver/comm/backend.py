"""The array backend (numpy on CPU, CuPy on a GPU) and the GPU plumbing around MPI.

The same drivers run on either backend: they allocate through :class:`Backend` and compute
through ``backend.xp``. CuPy is imported only when a GPU is asked for (or probed by
``device = "auto"``), so this module imports on machines without CUDA.

Device buffers reach MPI in one of two ways:

* the MPI library is CUDA-aware (:func:`detect_cuda_aware`): device arrays go to ``Send``/``Recv``
  directly, after :meth:`Backend.synchronize` so that MPI never reads a buffer a kernel is still
  writing;
* it is not: every block has a pinned host mirror in :class:`StagingBuffers`, and messages travel
  from and to those mirrors.
"""

from __future__ import annotations

import ctypes
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from pserver.errors import BackendError, ConfigError

log = logging.getLogger(__name__)

DEVICES = ("cpu", "gpu", "auto")
CUDA_AWARE_CHOICES = ("auto", "yes", "no")

# Lets a user override detection without a config change (e.g. in a SLURM script).
CUDA_AWARE_ENV = "PSERVER_CUDA_AWARE"

# Environment switches consulted only when the library offers no runtime query, by library family
# (how the first word of mpi4py's get_vendor() starts): the variables that may switch it on.
_VENDOR_ENV: dict[str, tuple[str, ...]] = {
    # Open MPI < 5 reads this MCA parameter; on a build without CUDA it does nothing, but a user
    # who sets it asserts the build has it.
    "Open": ("OMPI_MCA_opal_cuda_support",),
    # MPICH >= 4 enables GPU support by default on GPU builds; the CVAR turns it off at run time.
    # Cray MPICH and MVAPICH2 need their own switch set explicitly.
    "MPICH": ("MPIR_CVAR_ENABLE_GPU", "MPICH_GPU_SUPPORT_ENABLED", "MV2_USE_CUDA"),
    "MVAPICH": ("MV2_USE_CUDA", "MPIR_CVAR_ENABLE_GPU"),
}
_TRUE = ("1", "yes", "true", "on", "enable", "enabled")
_FALSE = ("0", "no", "false", "off", "disable", "disabled")

_HOW_TO_GET_CUPY = (
    "install the CuPy wheel matching your CUDA toolkit (pip install cupy-cuda12x, or "
    'cupy-cuda11x for CUDA 11), or run on the CPU with run.device = "cpu"'
)


@dataclass(frozen=True)
class Backend:
    """Where arrays live: ``name`` is "cpu" (``xp`` is numpy) or "gpu" (``xp`` is CuPy).

    ``device_id`` is the CUDA device this rank uses (``None`` on CPU). ``cuda_aware`` says that
    device buffers may be handed to MPI directly; it is always False on CPU, where there are no
    device buffers.
    """

    name: str
    xp: Any
    device_id: int | None
    cuda_aware: bool

    @property
    def is_gpu(self) -> bool:
        return self.name == "gpu"

    @property
    def needs_staging(self) -> bool:
        """Device buffers must go through pinned host mirrors (:class:`StagingBuffers`)."""
        return self.is_gpu and not self.cuda_aware

    def activate(self) -> None:
        """Make this backend's device current for the calling thread.

        CUDA's current device is per thread: a thread that touches device arrays (an I/O or
        progress thread) must call this once, or its allocations land on device 0.
        """
        if self.is_gpu:
            self.xp.cuda.runtime.setDevice(self.device_id)

    def asarray(self, a: Any, dtype: Any = None) -> Any:
        """``a`` as an array of this backend (no copy when it already is one of ``dtype``)."""
        return self.xp.asarray(a, dtype=dtype)

    def to_host(self, a: Any) -> np.ndarray:
        """``a`` as a numpy array (a device-to-host copy on GPU; for dumps, not the hot path)."""
        if self.is_gpu and not isinstance(a, np.ndarray):
            return self.xp.asnumpy(a)
        return np.asarray(a)

    def copy_to_host(self, a: Any, out: np.ndarray) -> np.ndarray:
        """Copy ``a`` into the preallocated host array ``out`` (no allocation on either side)."""
        if self.is_gpu and not isinstance(a, np.ndarray):
            a.get(out=out)  # synchronous on the current stream
        else:
            np.copyto(out, a)
        return out

    def copy_from_host(self, host: np.ndarray, out: Any) -> Any:
        """Copy the host array ``host`` into the preallocated backend array ``out``."""
        if self.is_gpu and not isinstance(out, np.ndarray):
            out.set(host)
        else:
            np.copyto(out, host)
        return out

    def empty(self, n: int, dtype: Any) -> Any:
        """An uninitialised 1-D array of ``n`` elements on this backend."""
        return self.xp.empty(n, dtype=dtype)

    def zeros(self, n: int, dtype: Any) -> Any:
        """A zero-filled 1-D array of ``n`` elements on this backend."""
        return self.xp.zeros(n, dtype=dtype)

    def synchronize(self) -> None:
        """Wait for the work queued on the current stream (before MPI reads a device buffer)."""
        if self.is_gpu:
            self.xp.cuda.get_current_stream().synchronize()


CPU = Backend(name="cpu", xp=np, device_id=None, cuda_aware=False)


def select_backend(
    device: str,
    local_rank: int,
    local_size: int,
    cuda_aware: str = "auto",
    *,
    mpi_module: Any = None,
    env: Mapping[str, str] = os.environ,
) -> Backend:
    """The backend for this rank.

    ``device``: "cpu"; "gpu" (CuPy and a visible CUDA device, or :class:`BackendError`); or
    "auto" (the GPU when both are there, else the CPU). ``local_rank``/``local_size`` are the
    rank's place among the ranks of its node (``COMM_TYPE_SHARED``), used to spread ranks over
    the node's devices. ``cuda_aware``: "yes"/"no" override :func:`detect_cuda_aware` ("auto").
    On GPU the chosen device is made current for the calling thread.
    """
    if device not in DEVICES:
        raise ConfigError(f"run.device = {device!r}: expected one of {', '.join(DEVICES)}")
    if cuda_aware not in CUDA_AWARE_CHOICES:
        raise ConfigError(
            f"cuda_aware = {cuda_aware!r}: expected one of {', '.join(CUDA_AWARE_CHOICES)}"
        )
    if not 0 <= local_rank < max(local_size, 1):
        raise ValueError(f"local rank {local_rank} outside 0..{local_size - 1}")
    if device == "cpu":
        return CPU
    try:
        cupy, n_devices = _probe_gpu()
    except BackendError as e:
        if device == "gpu":
            raise
        log.info("device = auto: using the CPU (%s)", e)
        return CPU
    device_id = choose_device(local_rank, n_devices)
    if local_size > n_devices:
        log.info("%d ranks on this node share %d GPU(s)", local_size, n_devices)
    cupy.cuda.runtime.setDevice(device_id)
    if cuda_aware == "auto":
        aware = detect_cuda_aware(mpi_module, env)
    else:
        aware = cuda_aware == "yes"
        if aware:
            _warn_if_library_disagrees(mpi_module)
    return Backend(name="gpu", xp=cupy, device_id=device_id, cuda_aware=aware)


def _warn_if_library_disagrees(mpi_module: Any) -> None:
    """A forced ``cuda_aware = "yes"`` against a library that says it cannot read device memory.

    Both MPICH 5.0 (PyPI) and Debian's Open MPI 4.1 crash or fail inside the first ``Send`` of a
    device buffer (segfault; ``process_vm_readv failed``), far from the setting that caused it.
    """
    if mpi_module is None:
        from mpi4py import MPI as mpi_module
    if _query_cuda_support(mpi_module) is False:
        log.warning(
            "comm.cuda_aware = yes, but the MPI library reports no CUDA support "
            "(MPIX_Query_cuda_support = 0): sending a device buffer will likely crash inside MPI"
        )


def _probe_gpu() -> tuple[Any, int]:
    """CuPy and the number of visible devices, or :class:`BackendError` saying what is missing."""
    try:
        import cupy
    except Exception as e:  # ImportError, or a broken CUDA install failing inside the import
        raise BackendError(
            f'device = "gpu" needs CuPy, which cannot be imported ({e}); {_HOW_TO_GET_CUPY}'
        ) from None
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    shown = "unset" if visible is None else repr(visible)
    try:
        n_devices = int(cupy.cuda.runtime.getDeviceCount())
    except Exception as e:  # CUDARuntimeError: no driver, or no device
        raise BackendError(
            f'device = "gpu": CuPy found no usable CUDA device ({e}); check the NVIDIA driver '
            f'(nvidia-smi) and CUDA_VISIBLE_DEVICES (now {shown}), or use run.device = "cpu"'
        ) from None
    if n_devices < 1:
        raise BackendError(
            f'device = "gpu": no CUDA device is visible; check CUDA_VISIBLE_DEVICES (now '
            f"{shown}) and the job's GPU request (e.g. srun --gpus-per-task), or use "
            f'run.device = "cpu"'
        )
    return cupy, n_devices


def choose_device(local_rank: int, n_devices: int) -> int:
    """The device of the ``local_rank``-th rank of a node with ``n_devices`` visible devices.

    Round robin, so ranks 0..7 over 4 devices get 0,1,2,3,0,1,2,3: every device is used before
    any is shared, and no two neighbouring ranks (often a learner and its aggregator) share one
    when they need not. Where the launcher already gives each rank its own device
    (CUDA_VISIBLE_DEVICES per task), ``n_devices`` is 1 and every rank correctly gets 0.
    """
    if n_devices < 1:
        raise BackendError("no CUDA device is visible; check CUDA_VISIBLE_DEVICES")
    if local_rank < 0:
        raise ValueError(f"local rank must be >= 0, got {local_rank}")
    return local_rank % n_devices


def detect_cuda_aware(mpi_module: Any = None, env: Mapping[str, str] = os.environ) -> bool:
    """Whether the MPI library accepts CUDA device buffers. Checked, first answer wins:

    1. ``PSERVER_CUDA_AWARE`` in ``env`` (yes/no, 1/0, true/false): the user's word.
    2. A runtime query: ``Query_cuda_support()`` or ``MPIX_Query_cuda_support()`` on the MPI
       module when it has one; otherwise, for the real ``mpi4py.MPI`` after ``MPI_Init``, the C
       function ``MPIX_Query_cuda_support`` of the loaded libmpi (MPICH >= 4.0 and Open MPI >= 2.0
       export it; it reports both the build and run-time switches such as
       ``MPIR_CVAR_ENABLE_GPU=0``).
    3. With no query available, the library family's switches in ``env``: Open MPI's
       ``OMPI_MCA_opal_cuda_support``; MPICH's ``MPIR_CVAR_ENABLE_GPU``, Cray MPICH's
       ``MPICH_GPU_SUPPORT_ENABLED``, MVAPICH2's ``MV2_USE_CUDA``. An explicit "off" wins.
    4. Otherwise False: host staging always works, while a wrong True crashes inside MPI.

    ``mpi_module`` defaults to ``mpi4py.MPI`` (imported here, which initializes MPI).
    """
    override = _parse_bool(env.get(CUDA_AWARE_ENV))
    if override is not None:
        return override
    if mpi_module is None:
        from mpi4py import MPI as mpi_module
    queried = _query_cuda_support(mpi_module)
    if queried is not None:
        return queried
    return _env_cuda_support(_vendor(mpi_module), env)


def _parse_bool(value: str | None) -> bool | None:
    if value is None:
        return None
    text = value.strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    return None


def _query_cuda_support(mpi_module: Any) -> bool | None:
    """The library's own runtime answer, or None when it offers none."""
    for name in ("Query_cuda_support", "MPIX_Query_cuda_support"):
        query = getattr(mpi_module, name, None)
        if callable(query):
            return bool(query())
    if getattr(mpi_module, "__name__", "") != "mpi4py.MPI" or not mpi_module.Is_initialized():
        return None  # a stand-in module, or too early: the C query is valid only after MPI_Init
    query = _native_query()
    return None if query is None else bool(query())


def _native_query() -> Any:
    """``MPIX_Query_cuda_support`` from the libmpi this process loaded, or None.

    mpi4py loads libmpi with local symbol visibility, so the library is found by path in the
    process's memory map (Linux) rather than in the global namespace.
    """
    candidates: list[str | None] = [None]
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "/libmpi" in line}
    except OSError:
        paths = set()
    candidates += sorted(p for p in paths if os.path.basename(p).startswith(("libmpi.", "libmpi_")))
    for path in candidates:
        try:
            lib = ctypes.CDLL(path)
            func = lib.MPIX_Query_cuda_support
        except (OSError, AttributeError):
            continue
        func.restype, func.argtypes = ctypes.c_int, []
        return func
    return None


def _vendor(mpi_module: Any) -> str:
    """The first word of the library's name: "MPICH", "Open", "Intel", ... ("" when unknown)."""
    get_vendor = getattr(mpi_module, "get_vendor", None)
    if callable(get_vendor):
        name = get_vendor()[0]
    else:
        get_version = getattr(mpi_module, "Get_library_version", None)
        name = get_version() if callable(get_version) else ""
    words = name.split()
    return words[0] if words else ""


def _env_cuda_support(vendor: str, env: Mapping[str, str]) -> bool:
    """The family's switches (every known one when the family is unknown); "off" wins."""
    names = {n for family, ns in _VENDOR_ENV.items() if vendor.startswith(family) for n in ns}
    if not names:
        names = {n for ns in _VENDOR_ENV.values() for n in ns}
    answers = [_parse_bool(env.get(name)) for name in sorted(names)]
    if False in answers:
        return False
    return True in answers


class StagingBuffers:
    """Pinned host mirrors of device blocks, for MPI libraries that are not CUDA-aware.

    One host buffer per block, allocated once (page-locked on GPU, so copies run at full PCIe
    speed and truly asynchronously); ``to_host``/``from_host`` copy on a dedicated copy stream
    ordered after the compute stream. On CPU the "device" arrays are numpy arrays and the mirrors
    plain numpy buffers, so the same code path runs (and is tested) without a GPU.
    """

    def __init__(self, backend: Backend, sizes: Sequence[int], dtype: Any) -> None:
        self.backend = backend
        self.dtype = np.dtype(dtype)
        self._host = [self._alloc_host(int(n)) for n in sizes]
        self._stream = self._event = None
        if backend.is_gpu:
            cuda = backend.xp.cuda
            with cuda.Device(backend.device_id):
                self._stream = cuda.Stream(non_blocking=True)
                self._event = cuda.Event(block=False, disable_timing=True)

    def _alloc_host(self, n: int) -> np.ndarray:
        if not self.backend.is_gpu:
            return np.empty(n, dtype=self.dtype)
        import cupyx  # lazy, as everything CuPy

        return cupyx.empty_pinned(n, dtype=self.dtype)

    def add(self, size: int) -> int:
        """One more host buffer of ``size`` elements (a weight version,
        pserver/protocols/versions.py);
        returns its index, used as a block index by the other methods."""
        self._host.append(self._alloc_host(int(size)))
        return len(self._host) - 1

    def host(self, block: int) -> np.ndarray:
        """The pinned host buffer of ``block`` (the one MPI sends from or receives into)."""
        return self._host[block]

    def to_host(self, block: int, device_array: Any) -> np.ndarray:
        """Copy ``device_array`` into the block's host buffer and return that buffer.

        Waits for the work already queued on the current stream (which may still be writing
        ``device_array``), then for the copy, so the buffer is complete when this returns.
        """
        host = self._host[block]
        self._check(block, device_array)
        if not self.backend.is_gpu:
            np.copyto(host, device_array)
            return host
        self._after_current_stream()
        self._memcpy(host.ctypes.data, device_array.data.ptr, host.nbytes, D2H)
        self._stream.synchronize()
        return host

    def from_host(self, block: int, device_array: Any) -> None:
        """Copy the block's host buffer into ``device_array``.

        Returns once the copy is done, so the host buffer may take the next receive at once;
        kernels queued later on the current stream see the new values.
        """
        host = self._host[block]
        self._check(block, device_array)
        if not self.backend.is_gpu:
            np.copyto(device_array, host)
            return
        self._after_current_stream()  # earlier kernels may still be reading device_array
        self._memcpy(device_array.data.ptr, host.ctypes.data, host.nbytes, H2D)
        self._stream.synchronize()

    def _check(self, block: int, device_array: Any) -> None:
        host = self._host[block]
        if device_array.size != host.size or device_array.dtype != host.dtype:
            raise ValueError(
                f"staging block {block} holds {host.size} x {host.dtype}, got "
                f"{device_array.size} x {device_array.dtype}"
            )
        if not device_array.flags.c_contiguous:
            raise ValueError(f"staging block {block}: the device array must be contiguous")

    def _after_current_stream(self) -> None:
        """Order the copy stream after everything queued so far on the current stream."""
        self._event.record(self.backend.xp.cuda.get_current_stream())
        self._stream.wait_event(self._event)

    def _memcpy(self, dst: int, src: int, nbytes: int, kind: int) -> None:
        # The runtime call on raw pointers: no temporary array, no per-message allocation.
        self.backend.xp.cuda.runtime.memcpyAsync(dst, src, nbytes, kind, self._stream.ptr)


# cudaMemcpyKind values (cuda_runtime_api.h); the GPU benchmarks use them too.
H2D = 1
D2H = 2
