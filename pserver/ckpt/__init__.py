"""Layer 1, pure (h5py, no MPI): checkpoint files and manifests, the resume check, warm starts and
the stored-dataset check; ``records/`` holds each owner's state as arrays and attributes, and
``drivers/`` (layer 4) the parts that save and restore over MPI."""
