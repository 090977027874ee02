"""The shard's serving path (``pserver.roles.shard_state.ShardPath``), decided once."""

from __future__ import annotations

import pytest

from pserver.plan.config import Config
from pserver.roles.shard_state import ShardPath


class Window:
    """The two facts of ``SharedWindows`` a path reads: local learners, and zero copy."""

    def __init__(self, local: dict[int, list[int]], single: bool) -> None:
        self.local, self.single = local, single

    def zero_copy(self, server: int) -> bool:
        return self.single and server in self.local


def test_messages_share_nothing_and_may_stage():
    path = ShardPath.of(Config(), 0, None, staged=True)
    assert path.shm is None and not path.window_peers and not path.zero_copy
    assert not path.shared(3) and not path.lends(3)
    assert path.mode.staged and not path.mode.sends_read_w


@pytest.mark.parametrize("single", [True, False])
def test_a_window_serves_its_local_learners_only(single):
    window = Window({0: [3, 4]}, single)
    path = ShardPath.of(Config(), 0, window, staged=True)
    assert path.shm is window and path.window_peers == {3, 4}
    assert path.shared(3) and not path.shared(5)
    assert path.lends(4) == single and not path.lends(5)
    assert not path.mode.staged  # the window makes host staging unnecessary
    with pytest.raises(AttributeError):
        path.zero_copy = not single  # type: ignore[misc]  # frozen: decided once


def test_a_shard_outside_the_window_uses_messages():
    path = ShardPath.of(Config(), 1, Window({0: [3]}, True), staged=False)
    assert path.shm is None and not path.shared(3) and not path.lends(3)
