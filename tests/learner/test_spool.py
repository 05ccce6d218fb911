"""The report queue's spool on a real directory: order through memory, disk and the write
buffer, the memory bound, a disk that fails and recovers, and cleaning up."""

from __future__ import annotations

import os
import random
import shutil
from collections import deque
from pathlib import Path

from ffdl.learner.spool import ITEM_OVERHEAD, SEGMENT_PREFIX, Spool


def segments(directory: Path) -> list[str]:
    return sorted(name for name in os.listdir(directory) if name.startswith(SEGMENT_PREFIX))


def drain_all(spool: Spool, batch: int = 37) -> list[str]:
    taken: list[str] = []
    while len(spool):
        texts = spool.peek(batch, 10_000)
        assert texts
        spool.pop(len(texts))
        taken.extend(texts)
    return taken


def test_items_come_out_in_order_through_memory_disk_and_buffer(tmp_path: Path) -> None:
    memory = 4096
    spool = Spool(str(tmp_path), memory_bytes=memory, segment_bytes=2048, write_chunk_bytes=512)
    model: deque[str] = deque()
    rng = random.Random(7)
    counter = 0
    peak = 0
    for _ in range(3000):
        if rng.random() < 0.6:
            for _ in range(rng.randint(1, 40)):
                pad = "x" * rng.randint(0, 80)
                text = f'{{"n":{counter},"pad":"{pad}"}}'
                counter += 1
                spool.put(text)
                model.append(text)
        else:
            texts = spool.peek(rng.randint(1, 60), rng.randint(1, 3000))
            assert texts == [model[i] for i in range(len(texts))]
            taken = rng.randint(0, len(texts))
            spool.pop(taken)
            for _ in range(taken):
                model.popleft()
        assert len(spool) == len(model)
        peak = max(peak, spool.memory_bytes)
    assert drain_all(spool) == list(model)
    # The head and the write buffer, each at most ``memory`` (plus the item that crossed it).
    assert peak <= 2 * memory + 2 * (ITEM_OVERHEAD + 100)
    assert spool.spilled_items > 0
    assert segments(tmp_path) == []


def test_a_line_longer_than_a_read_chunk_is_read_whole(tmp_path: Path) -> None:
    spool = Spool(str(tmp_path), memory_bytes=1024, write_chunk_bytes=64)
    big = "y" * 3_000_000
    texts = ['{"n":0}', f'{{"big":"{big}"}}', '{"n":2}', '{"n":3}']
    for text in texts:
        spool.put(text)
    assert drain_all(spool, batch=1) == texts


def test_a_failing_disk_keeps_items_in_memory_and_loses_none(tmp_path: Path) -> None:
    directory = tmp_path / "spool"
    memory = 2048
    spool = Spool(str(directory), memory_bytes=memory, segment_bytes=256, write_chunk_bytes=256)
    expected = [f'{{"n":{n}}}' for n in range(400)]
    for text in expected[:100]:
        spool.put(text)
    assert segments(directory)
    # New segments cannot be made: the buffer keeps what the disk will not take, and says
    # it is full once it holds as much as the head may.
    shutil.rmtree(directory)
    for text in expected[100:]:
        spool.put(text)
    assert spool.problem is not None and "cannot spool" in spool.problem
    assert spool.full
    assert len(spool) == 400

    directory.mkdir()
    assert drain_all(spool) == expected
    assert not spool.full


def test_segments_of_an_earlier_controller_are_removed_and_close_cleans_up(
    tmp_path: Path,
) -> None:
    (tmp_path / f"{SEGMENT_PREFIX}000001").write_text('{"old":1}\n')
    (tmp_path / "controller.log").write_text("kept\n")
    spool = Spool(str(tmp_path), memory_bytes=256, write_chunk_bytes=64)
    assert segments(tmp_path) == []
    for n in range(100):
        spool.put(f'{{"n":{n}}}')
    assert segments(tmp_path)
    spool.close()
    assert segments(tmp_path) == []
    assert (tmp_path / "controller.log").exists()

    private = Spool(None, memory_bytes=256, write_chunk_bytes=64)
    for n in range(100):
        private.put(f'{{"n":{n}}}')
    made = private._directory
    assert made is not None and os.path.isdir(made)
    private.close()
    assert not os.path.exists(made)
