#!/usr/bin/env bash
# Set up (idempotent) and run the lint and the whole test suite; every MPI test has a hard timeout.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# tests/test_mpi_multihost.py makes network namespaces (root, ip, tc, unshare); as root, install
# what is missing rather than skip it; if that fails the test skips with its reason
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null \
    && ! { command -v ip && command -v tc && command -v unshare; } >/dev/null; then
    { apt-get update -qq && apt-get install -y -qq iproute2 util-linux; } >/dev/null \
        || echo "test.sh: could not install iproute2/util-linux: the multi-host test will skip" >&2
fi
export PATH="$PWD/.venv/bin:$PATH"
ruff check pserver learners scripts tests
python -m pytest -q "$@"
