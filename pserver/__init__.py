"""pserver: an MPI parameter-server framework for data-parallel SGD research."""

__version__ = "0.1.0"
