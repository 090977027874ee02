"""Fault injection for mpiexec tests: Python imports this at start-up when its directory is on
PYTHONPATH, in every rank, before pserver; no code of pserver knows about it.

``PSERVER_TEST_FAULT = "RANK:KIND"`` makes that rank (``PMI_RANK``, set by MPICH's Hydra) fail
when it reads a dataset of an HDF5 file, i.e. while it prepares the run:

* ``memory``: raise ``MemoryError``, as a node with less memory than the others would;
* ``hang``: block until the file named by ``PSERVER_TEST_RELEASE`` exists, then raise
  ``OSError`` (EIO), as a hung and then failing network file system would.
"""

import os

_fault = os.environ.get("PSERVER_TEST_FAULT", "")
_rank, _, _kind = _fault.partition(":")
# the launcher's rank: Hydra's PMI_RANK, or Open MPI's OMPI_COMM_WORLD_RANK
_mine = os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK"))
if _fault and _mine == _rank:
    import errno
    import time
    from pathlib import Path

    import h5py

    def _failing_read(self, key):  # noqa: ANN001, ANN202
        if _kind == "memory":
            raise MemoryError(f"injected on rank {_rank} (PSERVER_TEST_FAULT)")
        release = Path(os.environ["PSERVER_TEST_RELEASE"])
        while not release.exists():  # the hung file system of this fault
            time.sleep(0.01)
        raise OSError(errno.EIO, f"injected on rank {_rank} (PSERVER_TEST_FAULT)")

    h5py.Dataset.__getitem__ = _failing_read
