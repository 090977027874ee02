"""Layer 4, drivers: the checkpoint cuts, saves and restores that talk over MPI (aggregator,
gossip, lockstep, overlap, shm, the end and periodic generations)."""
