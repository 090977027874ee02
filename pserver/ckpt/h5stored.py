"""Whether an HDF5 object is a dataset stored in the file itself (pure: h5py, no MPI).

External links, soft links, virtual datasets and external raw storage would make pserver read
other files than the one a config names (any file that file's author chose), so every reader
of a user's HDF5 file (a dataset, ``learners.data``; a warm start's dump,
``pserver.ckpt.warm_start``) refuses them before anything is followed. This is the check once; each
caller words its own message.
"""

from __future__ import annotations

from typing import Any

MISSING, LINK, GROUP, OUTSIDE = "missing", "link", "group", "outside"


def stored(f: Any, key: str) -> tuple[Any, str | None, str]:
    """``(dataset, None, "")`` when ``f[key]`` is a dataset stored in ``f`` itself, else
    ``(None, problem, detail)``: :data:`MISSING`; :data:`LINK` (detail: the link's type name);
    :data:`GROUP`; :data:`OUTSIDE` (a virtual dataset, or raw data in external files)."""
    import h5py

    link = f.get(key, getlink=True)
    if link is None:
        return None, MISSING, ""
    if not isinstance(link, h5py.HardLink):
        return None, LINK, type(link).__name__
    obj = f.get(key)
    if not isinstance(obj, h5py.Dataset):
        return None, GROUP, ""
    if obj.is_virtual or obj.external:
        return None, OUTSIDE, ""
    return obj, None, ""
