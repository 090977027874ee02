"""Read TensorBoard event files back in tests: TensorBoard's own ``EventAccumulator`` when
``tensorboard`` is installed, else the records parsed here (tensorboardX ships no reader): the
TFRecord framing (length, its masked CRC-32C, the bytes, their masked CRC-32C, every CRC
checked) around ``Event`` protobufs that tensorboardX's generated ``event_pb2`` decodes."""

from __future__ import annotations

import struct
from pathlib import Path

Scalars = dict[str, list[tuple[int, float, float]]]  # tag -> [(step, value, wall time)]


def read_scalars(folder: Path) -> Scalars:
    """Every scalar of the event files in ``folder``, in the order written."""
    try:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    except ImportError:
        out: Scalars = {}
        for path in sorted(folder.glob("events.out.tfevents.*")):
            for event in events(path):
                for v in event.summary.value:
                    out.setdefault(v.tag, []).append((event.step, v.simple_value, event.wall_time))
        return out
    acc = EventAccumulator(str(folder), size_guidance={"scalars": 0})
    acc.Reload()
    return {t: [(e.step, e.value, e.wall_time) for e in acc.Scalars(t)]
            for t in acc.Tags()["scalars"]}


def events(path: Path) -> list:  # noqa: ANN201 - tensorboardX's Event messages
    """The ``Event`` records of one file; a damaged record raises AssertionError."""
    from tensorboardX.proto.event_pb2 import Event
    from tensorboardX.record_writer import masked_crc32c

    data, at, out = path.read_bytes(), 0, []
    while at < len(data):
        header = data[at : at + 8]
        (length,) = struct.unpack("<Q", header)
        (crc,) = struct.unpack("<I", data[at + 8 : at + 12])
        assert crc == masked_crc32c(header), f"{path}: bad length CRC at byte {at}"
        body = data[at + 12 : at + 12 + length]
        (crc,) = struct.unpack("<I", data[at + 12 + length : at + 16 + length])
        assert len(body) == length and crc == masked_crc32c(body), f"{path}: bad record at {at}"
        out.append(Event.FromString(body))
        at += 16 + length
    return out
