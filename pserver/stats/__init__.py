"""Statistics dump of a run: the HDF5 writer, its reader and the ``pserver-stats`` tool."""
