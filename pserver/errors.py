"""Exceptions that end a run before training with one readable message."""


class PserverError(Exception):
    """Base class: the CLI prints ``pserver: error: <message>`` and exits 2."""


class ConfigError(PserverError):
    """A config key, value or combination that cannot run."""


class TopologyError(PserverError):
    """The world size does not fit the requested roles."""


class DataError(PserverError):
    """A dataset file that is missing or malformed."""


class BackendError(PserverError):
    """A device backend (e.g. CuPy on a GPU) that was asked for but cannot be used."""
