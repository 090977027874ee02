#!/usr/bin/env bash
# Create .venv with MPICH (mpiexec lands in .venv/bin), mpi4py, numpy, h5py and pserver itself.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e ".[mpich,test]"
