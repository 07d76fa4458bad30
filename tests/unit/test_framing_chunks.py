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
    data = frame(b"a" * 100) + frame(b"b" * 120)
    frames = FrameDecoder(1000).feed(data)
    assert [bytes(f) for f in frames] == [b"a" * 100, b"b" * 120]
    assert all(isinstance(f, memoryview) and f.readonly for f in frames)


def test_a_small_frame_in_a_big_read_is_copied_not_a_view_pinning_the_read() -> None:
    """R-NF-3: a 3-byte frame must not keep a 256 KiB read buffer alive while queued."""
    data = frame(b"abc") + frame(b"x" * 20_000)[:10_000]
    frames = FrameDecoder(100_000).feed(data)
    assert frames == [b"abc"] and isinstance(frames[0], bytes)


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


class Pool:
    """A reservation callback that says yes while its budget lasts."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.asked: list[int] = []

    def __call__(self, size: int) -> bool:
        self.asked.append(size)
        if size > self.budget:
            return False
        self.budget -= size
        return True


def test_the_reservation_is_asked_for_the_full_size_when_the_prefix_arrives() -> None:
    """R-NF-3 (queued.max.request.bytes): the frame's size is reserved from its prefix,
    before any body byte is buffered."""
    pool = Pool(10_000)
    dec = FrameDecoder(1_000_000, pool)
    assert dec.feed(struct.pack(">i", 5000)) == []
    assert pool.asked == [5000]
    assert dec.reserved_partial == 5000


def test_a_refused_reservation_stops_the_decoder_until_retry() -> None:
    """A frame that does not fit waits with the bytes after its prefix kept as they are;
    ``retry`` goes on once memory is free, and nothing is lost or reordered."""
    pool = Pool(150)
    dec = FrameDecoder(1000, pool)
    wire = frame(b"a" * 100) + frame(b"b" * 200) + frame(b"c" * 10)
    got = dec.feed(wire[:50])
    assert got == []
    got = [bytes(f) for f in dec.feed(wire[50:])]
    assert got == [b"a" * 100]
    assert dec.waiting == 200
    assert dec.buffered == len(wire) - 104  # the 200-byte frame's prefix and all after it
    assert dec.retry() == [] and dec.waiting == 200  # still no memory
    pool.budget += 1000
    got = [bytes(f) for f in dec.retry()]
    assert got == [b"b" * 200, b"c" * 10]
    assert dec.waiting == 0 and dec.buffered == 0


def test_a_frame_spanning_feeds_is_received_into_one_buffer_of_its_size() -> None:
    """No per-chunk list joined at the end: the pieces land in one preallocated buffer
    (an anonymous mapping for big frames, returned to the kernel when dropped)."""
    payload = bytes(range(256)) * 8192  # 2 MiB
    wire = frame(payload)
    dec = FrameDecoder(len(payload))
    out = []
    for i in range(0, len(wire), 65536):
        out += dec.feed(wire[i : i + 65536])
        if not out:
            assert dec.reserved_partial == len(payload)
    assert len(out) == 1 and isinstance(out[0], memoryview) and out[0].readonly
    assert out[0] == payload


@pytest.mark.parametrize("seed", range(10))
def test_random_chunking_with_a_stingy_pool(seed: int) -> None:
    """Frames come back in order whatever the chunking and however often memory is short."""
    rng = random.Random(seed)
    payloads = [rng.randbytes(rng.choice([0, 1, 5, 300, 5000])) for _ in range(40)]
    wire = b"".join(frame(p) for p in payloads)
    pool = Pool(0)
    dec = FrameDecoder(100_000, pool)
    got: list[bytes] = []
    pos = 0
    while pos < len(wire) or dec.waiting or dec.buffered:
        if pos < len(wire):
            n = rng.choice([1, 3, 4, 64, 4096])
            got += [bytes(f) for f in dec.feed(wire[pos : pos + n])]
            pos += n
        pool.budget += rng.choice([0, 100, 6000])
        got += [bytes(f) for f in dec.retry()]
    assert got == payloads


def test_a_lazy_decoder_allocates_only_what_arrives() -> None:
    """Issue 23 item 2 (before SASL authentication): a prefix alone allocates nothing;
    the frame's buffer grows with its bytes and the frame comes out whole."""
    dec = FrameDecoder(1_000_000)
    dec.lazy = True
    payload = bytes(range(256)) * 1000
    wire = frame(payload)
    assert dec.feed(wire[:4]) == [] and dec.in_progress and dec.unreceived == len(payload)
    assert dec._buf is not None and len(dec._buf) == 0
    assert dec.feed(wire[4:1000]) == [] and len(dec._buf) == 996
    got = dec.feed(wire[1000:])
    assert [bytes(f) for f in got] == [payload] and not dec.in_progress


def test_frames_before_an_oversized_prefix_are_handed_back_with_the_error() -> None:
    """Frames completed (and reserved) in the same feed as a prefix over the limit travel
    with the error, so their reservations can be given back (they leaked before)."""
    pool = Pool(10_000)
    dec = FrameDecoder(100, pool)
    with pytest.raises(FrameTooLargeError) as e:
        dec.feed(frame(b"a" * 10) + frame(b"b" * 20) + struct.pack(">i", 5000))
    assert [bytes(f) for f in e.value.frames] == [b"a" * 10, b"b" * 20]
    assert pool.asked == [10, 20]
