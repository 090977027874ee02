"""Helpers shared by the benchmark scripts (run as ``python scripts/NAME.py``)."""

from __future__ import annotations

import time
from pathlib import Path


def cpu_idle(seconds: float = 1.0) -> float:
    """Fraction of all cores idle over ``seconds`` (from /proc/stat; 1.0 where there is none)."""

    def sample() -> tuple[int, int]:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
        return fields[3] + fields[4], sum(fields[:8])  # idle + iowait, total

    try:
        idle0, total0 = sample()
        time.sleep(seconds)
        idle1, total1 = sample()
    except (OSError, ValueError, IndexError):
        return 1.0
    return (idle1 - idle0) / max(total1 - total0, 1)
