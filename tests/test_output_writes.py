"""``oasr transcribe --output-dir``'s writes: two runs writing the same directory at once both succeed, every
output is whole, and no partial file is left behind."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from oasr.transcribe_command import write_output

NUM_WRITES = 400


def test_two_writers_of_the_same_output_never_fail_and_leave_whole_files(tmp_path: Path):
    target = tmp_path / "clip.txt"
    texts = ["first writer " * 2000, "second writer " * 2000]  # large enough that writes overlap
    failures: list[BaseException] = []
    start = threading.Barrier(2)

    def writer(text: str) -> None:
        start.wait()
        for _ in range(NUM_WRITES):
            try:
                write_output(target, text)
            except OSError as exc:
                failures.append(exc)

    threads = [threading.Thread(target=writer, args=(text,)) for text in texts]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
    assert target.read_text(encoding="utf-8") in texts
    assert sorted(os.listdir(tmp_path)) == ["clip.txt"]


def test_an_output_gets_the_permissions_a_plain_write_gives(tmp_path: Path):
    plain = tmp_path / "plain.txt"
    plain.write_text("x", encoding="utf-8")
    write_output(tmp_path / "out.txt", "x")
    assert (tmp_path / "out.txt").stat().st_mode == plain.stat().st_mode
