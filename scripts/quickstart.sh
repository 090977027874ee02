#!/usr/bin/env bash
# Fresh clone -> .venv -> train the digits MLP with 1 server, stats, data and 4 learners (7 ranks),
# then summarize and plot the HDF5 dump. Extra arguments are config overrides, e.g.
#   bash scripts/quickstart.sh protocol.name=softsync protocol.n=1
# Each run gets its own directory runs/quickstart/<date>-<time>-<pid>/ (runs/quickstart/latest
# points at the newest): running it again never replaces an earlier run.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH"
export PSERVER_RUN_ID=${PSERVER_RUN_ID:-$(date +%Y%m%d-%H%M%S)-$$}
out=$(python -m pserver.runtime.rundir examples/quickstart.toml "$@")
mpiexec -n 7 pserver-run examples/quickstart.toml "$@"
pserver-stats summary "$out"
pserver-stats plot "$out" -o "$out"
echo
echo "dump:  $out/stats.h5   (pserver-stats summary $out; pserver-stats export $out --csv DIR)"
echo "plots: $out/staleness.png $out/test_error.png $out/train_loss.png"
