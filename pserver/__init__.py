"""pserver: an MPI parameter-server framework for data-parallel SGD research.

``pserver.run(config, learners=N, overrides={...})`` launches a job and ``pserver.open_run(path)``
opens one on disk (:mod:`pserver.job.api`, docs/api.md). Both are loaded on first use (PEP 562),
so ``import pserver`` stays cheap and imports nothing of the layers above.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

#: the Python API: name -> its module, imported when first asked for
LAZY = {"run": "pserver.job.api", "open_run": "pserver.job.api", "Run": "pserver.job.api"}


def __getattr__(name: str) -> Any:
    if name not in LAZY:
        raise AttributeError(f"module 'pserver' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(LAZY[name]), name)
