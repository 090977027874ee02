#!/usr/bin/env bash
# One command for a GPU machine: what is there, the GPU tests (models, kernels, staging and real
# mpiexec runs on the GPU), a short GPU training run, the GPU-vs-CPU loss curves, the GPU
# benchmarks (device updates, staging, push/pull per path). Every step runs even when an earlier
# one fails; the exit code is nonzero if any did.
#
#   bash scripts/gpu_check.sh            # logs in $OUT when set (the device runner's folder),
#                                        # else in runs/gpu_check
#
# Expects CuPy, mpi4py, numpy and h5py in $PYTHON (default python3). When the checkout carries
# wheels in .whl/ (e.g. mpich, for an mpi4py wheel that finds no libmpi), they are installed
# into /tmp/pserver-site first. --prefix, not --target: with --target pip drops the data files
# under lib/, i.e. MPICH's libmpi.so, so mpi4py would still find no MPI library.
set -uo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
LOG_DIR=${OUT:-runs/gpu_check}
RUN_DIR=$LOG_DIR/gpu_run
STEP_TIMEOUT=${STEP_TIMEOUT:-300}  # seconds per step; every mpiexec runs under a timeout
PYTEST_TIMEOUT=${PYTEST_TIMEOUT:-420}  # the GPU tests launch ~12 mpiexec jobs
mkdir -p "$LOG_DIR"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # this checkout, installed or not
# A virtual environment's MPICH (pip install mpich) sits next to its python, maybe not on PATH.
PY_DIR=$(cd "$(dirname "$(command -v "$PY")")" && pwd)
command -v mpiexec >/dev/null || export PATH="$PATH:$PY_DIR"
# Open MPI refuses to start as root without these (lent machines often run as root); others
# ignore them.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

declare -a SUMMARY=()
FAILED=0

# step NAME CMD...: run CMD with its output shown and kept in $LOG_DIR/NAME.log. CMD runs in
# this shell (tee through a process substitution, not a pipe), so what a step exports stays.
step() {
    local name=$1 rc
    shift
    echo
    echo "=== $name: $*"
    "$@" > >(tee "$LOG_DIR/$name.log") 2>&1
    rc=$?
    wait $!  # the tee, so the log is complete and the output in order
    if [ "$rc" = 0 ]; then
        SUMMARY+=("$(printf '%-10s ok' "$name")")
    else
        SUMMARY+=("$(printf '%-10s FAILED (rc=%s)' "$name" "$rc")")
        FAILED=1
    fi
}

install_wheels() {
    local prefix=/tmp/pserver-site site
    "$PY" -m pip install --no-index --no-deps --prefix "$prefix" .whl/*.whl || return
    site=$(find "$prefix" -maxdepth 4 -type d -name site-packages | head -n 1)
    export PYTHONPATH="$site:$PYTHONPATH"
    export PATH="$prefix/bin:$PATH"  # mpiexec and hydra_pmi_proxy of the MPICH wheel
    export LD_LIBRARY_PATH="$prefix/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"  # its libmpi.so
    echo "installed into $prefix (site-packages: $site)"
}

versions() {
    if command -v nvidia-smi >/dev/null; then nvidia-smi; else echo "nvidia-smi: not found"; fi
    echo
    command -v mpiexec && mpiexec --version 2>&1 | head -n 3
    "$PY" - <<'EOF'
import platform, sys

print(f"python {platform.python_version()} ({sys.executable})")
for name in ("numpy", "h5py", "mpi4py", "cupy", "sklearn", "pytest"):
    try:
        module = __import__(name)
        print(f"{name} {module.__version__}")
    except Exception as e:
        print(f"{name}: MISSING ({e})")
try:
    import cupy
    rt, drv = cupy.cuda.runtime.runtimeGetVersion(), cupy.cuda.runtime.driverGetVersion()
    print(f"CUDA runtime {rt}, driver {drv}, devices {cupy.cuda.runtime.getDeviceCount()}")
except Exception as e:
    print(f"CUDA via CuPy: unavailable ({e})")
try:
    from mpi4py import MPI

    print(MPI.Get_library_version().splitlines()[0])
    from pserver.comm.backend import detect_cuda_aware

    print(f"CUDA-aware MPI: {detect_cuda_aware(MPI)}")
except Exception as e:
    print(f"MPI: unavailable ({e})")
EOF
}

training_run() {
    # pserver-run's main() through $PY itself: a pserver-run on PATH may belong to another
    # environment, one without CuPy.
    local launcher=("$PY" -m pserver.job.cli) extra=()
    if ! "$PY" -c "import sklearn" 2>/dev/null; then
        # The digits come from scikit-learn; without it, train on synthetic data of the same shape.
        echo "scikit-learn is missing: using data.source=synthetic instead of the digits"
        extra+=(data.source=synthetic)
    fi
    timeout "$STEP_TIMEOUT" mpiexec -n 6 "${launcher[@]}" examples/quickstart.toml run.device=gpu \
        "run.out_dir=$RUN_DIR" run.overwrite=true run.epochs=3 ${extra[@]+"${extra[@]}"} || return
    ls -l "$RUN_DIR"
    if "$PY" -c "import pserver.stats.cli" 2>/dev/null; then
        "$PY" -m pserver.stats.cli summary "$RUN_DIR/stats.h5"
    fi
}

if [ -d .whl ] && compgen -G ".whl/*.whl" >/dev/null; then
    step wheels install_wheels
fi
step versions versions
# A test module that cannot be imported here (a package the GPU machine lacks) must not keep
# the GPU tests of the other modules from running; it still fails the step.
step pytest timeout "$PYTEST_TIMEOUT" "$PY" -m pytest -m gpu -q -rs -p no:cacheprovider \
    --continue-on-collection-errors
step train training_run
# λ = 1 on both backends, step by step; the plot lands beside the logs, the dumps in /tmp.
step curves timeout "$STEP_TIMEOUT" "$PY" scripts/compare_backends.py --models mlp cnn \
    --dtypes float64 float32 --epochs 3 --check --plot --quiet-idle 0 --out /tmp/pserver-curves
cp /tmp/pserver-curves/loss_curves.png "$LOG_DIR/" 2>/dev/null
step bench timeout "$STEP_TIMEOUT" "$PY" scripts/bench_gpu.py
step pushpull timeout "$STEP_TIMEOUT" "$PY" scripts/bench_pushpull.py --device gpu \
    --sizes 16 64 --learners 1 4 --blocks 1 4 --quiet-idle 0 --mpiexec mpiexec \
    --pserver-run "$PY -m pserver.job.cli"

echo
echo "=== summary (logs in $LOG_DIR)"
printf '%s\n' "${SUMMARY[@]}" | tee "$LOG_DIR/summary.log"
exit "$FAILED"
