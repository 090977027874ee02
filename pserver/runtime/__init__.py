"""Layer 3, runtime: what a rank sets up over MPI before its driver runs (the prepared context,
logging, signals, run directories, provenance, the start-up agreement)."""
