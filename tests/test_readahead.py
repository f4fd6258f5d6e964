"""Start-up's read-ahead (``switch/readahead.py``): the next preloads' checkpoints read into the page cache, in
start-up order, at most ``AHEAD`` models ahead of the preloads that ended, and only where the host's memory holds
them; the pages really in the cache afterwards (``mincore``).

Run: pytest tests/test_readahead.py
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from pathlib import Path

from test_preloads import switcher

from hotweights.switch import readahead, startup
from hotweights.switch.readahead import AHEAD, RESERVE, ReadAhead, read_into_cache, shard_paths
from hotweights.verify.memory import evict_page_cache, page_cache_resident


def written(path: Path, nbytes: int) -> Path:
    path.write_bytes(os.urandom(nbytes))
    return path


def test_it_reads_every_byte_of_each_file_and_stops_when_asked(tmp_path):
    files = [written(tmp_path / "a", 0), written(tmp_path / "b", 5 << 20), written(tmp_path / "c", 33 << 20 | 7)]
    assert read_into_cache([*files, tmp_path / "gone"]) == (5 << 20) + (33 << 20 | 7)  # a missing file is skipped
    stop = threading.Event()
    stop.set()
    assert read_into_cache(files, stop) == 0


def test_what_it_read_is_in_the_page_cache(tmp_path):
    """The file's pages evicted (``verify.memory.evict_page_cache``), then read ahead: all resident (mincore)."""
    path = written(tmp_path / "shard.safetensors", 64 << 20)
    evict_page_cache(tmp_path)
    before = page_cache_resident(tmp_path)
    assert read_into_cache([path]) == 64 << 20
    assert page_cache_resident(tmp_path) == 1.0 and before is not None and before < 1.0, before


def test_it_reads_in_start_up_order_at_most_ahead_models_beyond_the_preloads_that_ended(tmp_path):
    ended: set[str] = set()
    order: list[str] = []

    def read(files: list[Path], stop: threading.Event) -> int:
        order.append(files[0].name)
        return 1 << 30

    reader = ReadAhead(["a", "b", "c", "d", "e"], lambda n: [tmp_path / n], lambda n: n in ended, read,
                       lambda: 100 << 30, look_s=0.005)

    def after(n: int) -> list[str]:
        deadline = time.monotonic() + 10
        while len(order) < n and time.monotonic() < deadline:
            time.sleep(0.005)
        time.sleep(0.1)  # nothing more comes
        return list(order)

    thread = threading.Thread(target=reader.run, daemon=True)
    thread.start()
    try:
        assert after(AHEAD) == ["a", "b"]  # two ahead of the preloads that ended: none yet
        ended.update({"a", "c"})  # a's preload ended; c's too, before its turn (it read its own files)
        assert after(3) == ["a", "b", "d"]  # then e waits for b's or d's
        ended.add("b")
        thread.join(10)
        assert not thread.is_alive() and order == ["a", "b", "d", "e"]
    finally:
        reader.stop.set()


def test_it_reads_nothing_the_hosts_memory_cannot_hold_beside_what_it_read(tmp_path, caplog):
    big = written(tmp_path / "big", 1 << 20)
    read: list[str] = []
    reader = ReadAhead(["a", "b"], lambda n: [big], lambda n: False,
                       lambda files, stop: read.append("x") or (3 << 30), lambda: RESERVE + (3 << 30) + (1 << 19),
                       look_s=0.005)
    with caplog.at_level("INFO", logger="hotweights.switch"):
        reader.run()
    assert read == ["x"]  # a fit; then b did not: a's 3 GiB still wait for a's preload
    assert "switch: b: not read ahead (1.00 MiB; 524288 bytes of the host's memory available beside what was " \
           "read ahead)" in caplog.text
    assert "switch: a: read ahead into the page cache, 3.00 GiB in" in caplog.text


def test_the_preloads_read_their_checkpoints_ahead_unless_the_config_turns_it_off(tmp_path, monkeypatch):
    from hotweights.demo_model import write_demo_model

    model = write_demo_model(tmp_path / "m", "tiny")
    assert shard_paths(model) == sorted(model.glob("*.safetensors")) and shard_paths(tmp_path / "none") == []
    read: list[list[Path]] = []
    monkeypatch.setattr(startup, "shard_paths", lambda checkpoint: shard_paths(model))
    monkeypatch.setattr(readahead, "read_into_cache", lambda files, stop: read.append(files) or 1)

    async def main(on: bool) -> None:
        s, _, _, _ = switcher(["a", "b", "c"], jobs=2, read_ahead=on)
        task = asyncio.create_task(s.run())
        while not all(m.started for m in s.models.values()) or s.life.busy.locked():
            await asyncio.sleep(0.005)
        task.cancel()

    asyncio.run(main(True))
    assert read and all(files == shard_paths(model) for files in read)  # a's at least: its preload had begun
    read.clear()
    asyncio.run(main(False))
    assert read == []
