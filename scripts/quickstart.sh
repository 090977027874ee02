#!/usr/bin/env bash
# Fresh clone -> .venv -> train the digits MLP with 1 server, stats, data and 4 learners (7 ranks),
# then summarize and plot the HDF5 dump. Extra arguments are config overrides, e.g.
#   bash scripts/quickstart.sh protocol.name=softsync protocol.n=1
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH"
out=runs/quickstart
mpiexec -n 7 pserver-run examples/quickstart.toml run.out_dir=$out run.overwrite=true "$@"
pserver-stats summary $out/stats.h5
pserver-stats plot $out/stats.h5 -o $out
echo
echo "dump:  $out/stats.h5   (pserver-stats summary $out/stats.h5; h5dump -H $out/stats.h5)"
echo "plots: $out/staleness.png $out/test_error.png $out/train_loss.png"
