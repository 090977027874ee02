"""Backend selection, device placement, CUDA-aware detection and host staging, without a GPU.

CuPy is replaced by small stand-in modules where the GPU branch of the plumbing is exercised;
the tests marked ``gpu`` run the real thing where CuPy and a device exist.
"""

from __future__ import annotations

import subprocess
import sys
import types

import numpy as np
import pytest

from pserver.comm.backend import (
    CPU,
    Backend,
    StagingBuffers,
    choose_device,
    detect_cuda_aware,
    select_backend,
)
from pserver.errors import BackendError, ConfigError
from pserver.optim.rules import RULES, make_updater
from pserver.plan.config import OptimConfig


def fake_cupy(n_devices: int = 0, error: Exception | None = None) -> tuple[types.ModuleType, list]:
    """A stand-in ``cupy`` reporting ``n_devices`` (or raising ``error``); records setDevice."""
    selected: list[int] = []

    def get_device_count() -> int:
        if error is not None:
            raise error
        return n_devices

    module = types.ModuleType("cupy")
    module.cuda = types.SimpleNamespace(
        runtime=types.SimpleNamespace(getDeviceCount=get_device_count, setDevice=selected.append)
    )
    return module, selected


def fake_mpi(vendor: str = "MPICH", **queries) -> types.SimpleNamespace:
    """A stand-in ``mpi4py.MPI``: ``get_vendor`` plus whatever query functions are given."""
    return types.SimpleNamespace(get_vendor=lambda: (vendor, (1, 0, 0)), **queries)


@pytest.fixture
def no_cupy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "cupy", None)  # makes ``import cupy`` raise ImportError


# -- selection ----------------------------------------------------------------------------------


def test_cpu_backend() -> None:
    backend = select_backend("cpu", local_rank=0, local_size=1)
    assert backend == CPU
    assert (backend.name, backend.xp, backend.device_id, backend.cuda_aware) == (
        "cpu",
        np,
        None,
        False,
    )
    assert not backend.is_gpu and not backend.needs_staging
    a = backend.empty(5, np.float32)
    assert isinstance(a, np.ndarray) and a.shape == (5,) and a.dtype == np.float32
    assert backend.zeros(3, np.float64).tolist() == [0.0, 0.0, 0.0]
    b = backend.asarray([1, 2], dtype=np.float64)
    assert backend.to_host(b) is b  # already on the host: no copy
    backend.synchronize()
    backend.activate()


def test_auto_falls_back_to_cpu_without_cupy(no_cupy: None) -> None:
    assert select_backend("auto", local_rank=3, local_size=4) == CPU


def test_auto_falls_back_to_cpu_without_device(monkeypatch: pytest.MonkeyPatch) -> None:
    module, selected = fake_cupy(n_devices=0)
    monkeypatch.setitem(sys.modules, "cupy", module)
    assert select_backend("auto", local_rank=0, local_size=1) == CPU
    assert selected == []


def test_gpu_without_cupy_says_how_to_fix(no_cupy: None) -> None:
    with pytest.raises(BackendError) as err:
        select_backend("gpu", local_rank=0, local_size=1)
    message = str(err.value)
    assert "CuPy" in message and "pip install cupy-cuda12x" in message
    assert 'run.device = "cpu"' in message


def test_gpu_without_device_says_how_to_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "cupy", fake_cupy(n_devices=0)[0])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(BackendError, match="no CUDA device is visible.*CUDA_VISIBLE_DEVICES"):
        select_backend("gpu", local_rank=0, local_size=1)


def test_gpu_with_broken_driver_says_how_to_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    error = RuntimeError("cudaErrorInsufficientDriver")
    monkeypatch.setitem(sys.modules, "cupy", fake_cupy(error=error)[0])
    with pytest.raises(BackendError, match="cudaErrorInsufficientDriver.*nvidia-smi"):
        select_backend("gpu", local_rank=0, local_size=1)


def test_gpu_selection_spreads_ranks_and_sets_device(monkeypatch: pytest.MonkeyPatch) -> None:
    module, selected = fake_cupy(n_devices=4)
    monkeypatch.setitem(sys.modules, "cupy", module)
    backend = select_backend("gpu", local_rank=5, local_size=8, cuda_aware="no")
    assert (backend.name, backend.xp, backend.device_id) == ("gpu", module, 1)
    assert backend.is_gpu and not backend.cuda_aware and backend.needs_staging
    assert selected == [1]  # the device is made current for the calling thread


def test_gpu_cuda_aware_override_and_detection(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "cupy", fake_cupy(n_devices=2)[0])
    unaware = fake_mpi(Query_cuda_support=lambda: False)
    aware = fake_mpi(Query_cuda_support=lambda: True)
    yes = select_backend("gpu", 0, 1, cuda_aware="yes", mpi_module=unaware, env={})
    assert yes.cuda_aware and not yes.needs_staging
    assert not select_backend("gpu", 0, 1, cuda_aware="no", mpi_module=aware, env={}).cuda_aware
    assert select_backend("gpu", 0, 1, mpi_module=aware, env={}).cuda_aware
    assert not select_backend("gpu", 0, 1, mpi_module=unaware, env={}).cuda_aware


def test_forcing_cuda_aware_against_the_library_warns(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, "cupy", fake_cupy(n_devices=1)[0])
    with caplog.at_level("WARNING", logger="pserver.comm.backend"):
        select_backend("gpu", 0, 1, cuda_aware="yes", mpi_module=fake_mpi(), env={})
        assert not caplog.records  # the library offers no query: nothing to contradict
        aware = fake_mpi(Query_cuda_support=lambda: True)
        select_backend("gpu", 0, 1, cuda_aware="yes", mpi_module=aware, env={})
        assert not caplog.records
        unaware = fake_mpi(Query_cuda_support=lambda: False)
        assert select_backend("gpu", 0, 1, cuda_aware="yes", mpi_module=unaware, env={}).cuda_aware
    assert len(caplog.records) == 1
    assert "reports no CUDA support" in caplog.records[0].getMessage()


def test_auto_uses_gpu_when_present(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "cupy", fake_cupy(n_devices=1)[0])
    backend = select_backend("auto", 2, 3, mpi_module=fake_mpi(), env={})
    assert backend.name == "gpu" and backend.device_id == 0


def test_bad_choices() -> None:
    with pytest.raises(ConfigError, match="run.device = 'tpu'"):
        select_backend("tpu", 0, 1)
    with pytest.raises(ConfigError, match="cuda_aware = 'maybe'"):
        select_backend("cpu", 0, 1, cuda_aware="maybe")
    with pytest.raises(ValueError, match="local rank 2"):
        select_backend("cpu", 2, 2)


def test_modules_import_without_touching_cupy() -> None:
    # A GPU-less install must import these; with ``cupy`` blocked, any top-level import fails.
    code = (
        "import sys; sys.modules['cupy'] = sys.modules['cupyx'] = None\n"
        "import pserver.comm.backend, pserver.optim.rules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


# -- device placement ---------------------------------------------------------------------------


def test_choose_device_round_robin() -> None:
    assert [choose_device(r, 4) for r in range(8)] == [0, 1, 2, 3, 0, 1, 2, 3]


def test_choose_device_more_devices_than_ranks() -> None:
    assert [choose_device(r, 8) for r in range(3)] == [0, 1, 2]


def test_choose_device_one_visible_device_per_rank() -> None:
    # srun --gpus-per-task: each rank sees only its own GPU, as device 0
    assert [choose_device(r, 1) for r in range(4)] == [0, 0, 0, 0]


def test_choose_device_errors() -> None:
    with pytest.raises(BackendError, match="CUDA_VISIBLE_DEVICES"):
        choose_device(0, 0)
    with pytest.raises(ValueError):
        choose_device(-1, 2)


# -- CUDA-aware detection -----------------------------------------------------------------------


@pytest.mark.parametrize("name", ["Query_cuda_support", "MPIX_Query_cuda_support"])
@pytest.mark.parametrize("answer", [0, 1])
def test_detect_uses_runtime_query(name: str, answer: int) -> None:
    mpi = fake_mpi(**{name: lambda: answer})
    assert detect_cuda_aware(mpi, env={}) is bool(answer)


def test_runtime_query_beats_environment() -> None:
    mpi = fake_mpi(Query_cuda_support=lambda: 0)
    assert not detect_cuda_aware(mpi, env={"MPIR_CVAR_ENABLE_GPU": "1"})


@pytest.mark.parametrize(
    "value,expected", [("yes", True), ("1", True), ("no", False), ("false", False)]
)
def test_user_override_beats_everything(value: str, expected: bool) -> None:
    mpi = fake_mpi(Query_cuda_support=lambda: not expected)
    assert detect_cuda_aware(mpi, env={"PSERVER_CUDA_AWARE": value}) is expected


@pytest.mark.parametrize(
    "vendor,env,expected",
    [
        ("Open MPI", {"OMPI_MCA_opal_cuda_support": "true"}, True),
        ("Open MPI", {"OMPI_MCA_opal_cuda_support": "0"}, False),
        ("Open MPI", {"MPIR_CVAR_ENABLE_GPU": "1"}, False),  # another family's switch
        ("MPICH", {"MPIR_CVAR_ENABLE_GPU": "1"}, True),
        ("MPICH", {"MPIR_CVAR_ENABLE_GPU": "0"}, False),
        ("MPICH", {"MPICH_GPU_SUPPORT_ENABLED": "1"}, True),  # Cray MPICH
        ("MPICH", {"MPICH_GPU_SUPPORT_ENABLED": "1", "MPIR_CVAR_ENABLE_GPU": "0"}, False),
        ("MPICH", {"OMPI_MCA_opal_cuda_support": "1"}, False),
        ("MVAPICH2", {"MV2_USE_CUDA": "1"}, True),
        ("MPICH", {}, False),
        ("Open MPI", {}, False),
        ("", {"MV2_USE_CUDA": "1"}, True),  # unknown family: every known switch counts
    ],
)
def test_detect_from_environment_without_query(vendor: str, env: dict, expected: bool) -> None:
    assert detect_cuda_aware(fake_mpi(vendor), env=env) is expected


def test_vendor_from_library_version_string() -> None:
    mpi = types.SimpleNamespace(Get_library_version=lambda: "Open MPI v5.0.3, package: ...")
    assert detect_cuda_aware(mpi, env={"OMPI_MCA_opal_cuda_support": "1"})


def test_detect_with_the_real_mpi_library() -> None:
    # In a child process so that this test session does not initialize MPI. The MPICH and
    # Open MPI wheels export MPIX_Query_cuda_support; either way the answer is a bool.
    code = "from pserver.comm.backend import detect_cuda_aware\nprint(detect_cuda_aware(env={}))\n"
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, timeout=120, capture_output=True, text=True
    ).stdout
    assert out.strip() in ("True", "False")


# -- host staging -------------------------------------------------------------------------------


def test_staging_round_trip_on_cpu() -> None:
    staging = StagingBuffers(CPU, [3, 5], np.float32)
    buffers = [staging.host(0), staging.host(1)]
    assert [b.size for b in buffers] == [3, 5] and all(b.dtype == np.float32 for b in buffers)

    device = np.arange(5, dtype=np.float32)
    host = staging.to_host(1, device)
    assert host is buffers[1] and host.tolist() == [0, 1, 2, 3, 4]
    device[:] = -1  # the mirror is a copy, not a view of the device array
    assert host.tolist() == [0, 1, 2, 3, 4]

    host *= 10  # as if MPI had received new values into the mirror
    staging.from_host(1, device)
    assert device.tolist() == [0, 10, 20, 30, 40]

    again = staging.to_host(0, np.ones(3, dtype=np.float32))
    assert again is buffers[0] and staging.host(1) is buffers[1]  # same buffers, every call


def test_staging_rejects_mismatched_arrays() -> None:
    staging = StagingBuffers(CPU, [4], np.float64)
    with pytest.raises(ValueError, match="4 x float64"):
        staging.to_host(0, np.zeros(4, dtype=np.float32))
    with pytest.raises(ValueError, match="4 x float64"):
        staging.from_host(0, np.zeros(5))
    with pytest.raises(ValueError, match="contiguous"):
        staging.to_host(0, np.zeros(8)[::2])


# -- on a real GPU ------------------------------------------------------------------------------


def gpu_backend() -> Backend:
    pytest.importorskip("cupy")
    try:
        return select_backend("gpu", local_rank=0, local_size=1, cuda_aware="no")
    except BackendError as e:
        pytest.skip(str(e))


@pytest.mark.gpu
@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_cupy_kernels_match_numpy(rule: str, dtype) -> None:
    backend = gpu_backend()
    cp = backend.xp
    n = 10_001  # not a multiple of any block size
    cfg = OptimConfig(rule=rule, momentum=0.9, weight_decay=1e-3, eps=1e-6)
    host_updater = make_updater(cfg, n, np, dtype)
    gpu_updater = make_updater(cfg, n, cp, dtype)
    rng = np.random.default_rng(0)
    w_host = rng.standard_normal(n).astype(dtype)
    w_gpu = cp.asarray(w_host)
    w_ptr = w_gpu.data.ptr
    for step, lr in enumerate([0.1, 0.05, 0.2, 0.1, 0.01]):
        g = rng.standard_normal(n).astype(dtype) * (step + 1)
        host_updater.step(w_host, g.copy(), lr)
        gpu_updater.step(w_gpu, cp.asarray(g), lr)
    # Same operations in the same order and no FMA contraction: agreement to the last bits.
    rtol = 1e-6 if dtype == np.float32 else 1e-13
    np.testing.assert_allclose(cp.asnumpy(w_gpu), w_host, rtol=rtol, atol=rtol)
    assert w_gpu.data.ptr == w_ptr and w_gpu.dtype == dtype
    host_state = host_updater.state_arrays()
    for name, array in gpu_updater.state_arrays().items():
        np.testing.assert_allclose(cp.asnumpy(array), host_state[name], rtol=rtol, atol=rtol)


@pytest.mark.gpu
def test_staging_round_trip_on_gpu() -> None:
    backend = gpu_backend()
    cp = backend.xp
    staging = StagingBuffers(backend, [1000, 7], np.float32)
    pinned = staging.host(0)
    device = cp.arange(1000, dtype=cp.float32) * 2  # queued on the current stream
    host = staging.to_host(0, device)
    assert host is pinned and isinstance(host, np.ndarray)
    np.testing.assert_array_equal(host, np.arange(1000, dtype=np.float32) * 2)
    host[:] = -3
    staging.from_host(0, device)
    assert float(device.sum()) == -3000.0
    assert staging.to_host(0, device) is pinned
    backend.synchronize()
    assert isinstance(backend.to_host(device), np.ndarray)
