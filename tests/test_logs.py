"""Per-rank log lines, and that an aborting rank's last words leave its pipe before the abort."""

from __future__ import annotations

import os
import threading

from pserver.runtime.logs import setup_logging, wait_until_read


def test_every_line_names_rank_role_and_host(capsys):
    log = setup_logging(3, "learner 1")
    log.info("hello")
    err = capsys.readouterr().err
    assert "[rank 3 learner 1 @" in err and "INFO hello" in err


def test_wait_until_read_sees_unread_bytes_in_a_pipe():
    r, w = os.pipe()
    with os.fdopen(r, "rb") as reader, os.fdopen(w, "w") as writer:
        writer.write("rank 4 failed\n")
        writer.flush()
        assert not wait_until_read(writer, timeout=0.05)  # nobody reads: the bytes are still there
        got = []
        t = threading.Thread(target=lambda: got.append(reader.read(14)))
        t.start()
        assert wait_until_read(writer, timeout=10)
        t.join(10)
        assert got == [b"rank 4 failed\n"]


def test_files_and_closed_streams_count_as_delivered(tmp_path):
    with open(tmp_path / "log.txt", "w") as f:
        f.write("x")
        assert wait_until_read(f, timeout=0)
    assert wait_until_read(f, timeout=0)  # closed: fileno() raises ValueError
