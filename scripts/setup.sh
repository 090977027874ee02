#!/usr/bin/env bash
# Create .venv with MPICH (mpiexec lands in .venv/bin), mpi4py, numpy, h5py, PyTorch (CPU) and pserver.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
# PyTorch (model.kind = "torch", its tests run in CI): ~48 s for the local CPU wheel on the
# 2-core machine under load; PSERVER_NO_TORCH=1 leaves it out (its tests then skip)
if [ -n "${PSERVER_NO_TORCH:-}" ]; then
    .venv/bin/python -m pip install -q -e ".[mpich,test]"
else
    .venv/bin/python -m pip install -q -e ".[mpich,test,torch]"
fi
