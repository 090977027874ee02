"""comm.max_inflight: validated before training (pserver/plan/config.py,
pserver/protocols/inflight.py)."""

from __future__ import annotations

import pytest

from pserver.errors import ConfigError
from pserver.plan.config import load_config


def test_default_is_auto_and_overlapped_async_or_softsync_accept_a_bound():
    assert load_config(None).comm.max_inflight == 0
    for proto in ("protocol.name=async", "protocol.name=softsync"):
        for mode in ("thread", "nonblocking"):
            cfg = load_config(None, [proto, f"comm.mode={mode}", "comm.max_inflight=1"])
            assert cfg.comm.max_inflight == 1


@pytest.mark.parametrize(
    "overrides, fragment",
    [
        (["comm.mode=thread", "protocol.name=async", "comm.max_inflight=-1"], ">= 0"),
        (["comm.mode=thread", "protocol.name=async", "comm.max_inflight=1.5"], "integer"),
        (["protocol.name=async", "comm.max_inflight=2"], "comm.mode = 'blocking'"),
        (["comm.mode=thread", "protocol.name=hardsync", "comm.max_inflight=2"], "'hardsync'"),
        (["comm.mode=nonblocking", "protocol.name=psp", "comm.max_inflight=3"], "'psp'"),
    ],
)
def test_bad_or_meaningless_bounds_are_refused(overrides, fragment):
    with pytest.raises(ConfigError, match="comm.max_inflight") as e:
        load_config(None, overrides)
    assert fragment in str(e.value)
