#!/usr/bin/env bash
# Set up (idempotent) and run the lint and the whole test suite; every MPI test has a hard timeout.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH"
ruff check pserver learners scripts tests
python -m pytest -q "$@"
