"""FrameDecoder: frames split at random points, zero-copy views, limits on split prefixes."""

from __future__ import annotations

import random
import struct

import pytest

from headrace.protocol.errors import FrameTooLargeError
from headrace.protocol.framing import FrameDecoder, frame


@pytest.mark.parametrize("seed", range(20))
def test_random_chunking_gives_the_frames_back(seed: int) -> None:
    rng = random.Random(seed)
    payloads = [rng.randbytes(rng.choice([0, 1, 3, 4, 5, 100, 5000, 70000])) for _ in range(30)]
    wire = b"".join(frame(p) for p in payloads)
    dec = FrameDecoder(100_000)
    got: list[bytes] = []
    pos = 0
    while pos < len(wire):
        n = rng.choice([1, 2, 3, 5, 64, 4096, 65536, 300000])
        got += [bytes(f) for f in dec.feed(wire[pos : pos + n])]
        pos += n
    assert got == payloads
    assert dec.buffered == 0


def test_whole_frames_are_read_only_views_of_the_data() -> None:
    data = frame(b"abc") + frame(b"defg")
    frames = FrameDecoder(10).feed(data)
    assert [bytes(f) for f in frames] == [b"abc", b"defg"]
    assert all(isinstance(f, memoryview) and f.readonly for f in frames)


def test_a_split_prefix_is_still_checked_against_the_limit() -> None:
    dec = FrameDecoder(1000)
    assert dec.feed(struct.pack(">i", 1001)[:2]) == []
    assert dec.buffered == 2
    with pytest.raises(FrameTooLargeError):
        dec.feed(struct.pack(">i", 1001)[2:])


def test_buffered_counts_a_partial_frame() -> None:
    dec = FrameDecoder(1000)
    assert dec.feed(frame(b"x" * 100)[:50]) == []
    assert dec.buffered == 50
    assert [bytes(f) for f in dec.feed(frame(b"x" * 100)[50:])] == [b"x" * 100]
    assert dec.buffered == 0
