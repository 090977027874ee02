"""Layer 1, pure (h5py, no MPI): the dump's schema, its incremental writer, its reader and its
consistency checks."""
