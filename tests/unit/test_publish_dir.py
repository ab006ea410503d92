"""publish_dir: a complete directory replaces the old one; a reader never finds none, a failed
swap keeps the old one, and no temp or old copy is left behind. atomic_writer: the same for a
file streamed in."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from searchrl.datasets import io
from searchrl.datasets.io import atomic_writer, exchange_paths, publish_dir


def _dir(path: Path, text: str) -> Path:
    path.mkdir(parents=True)
    (path / "marker").write_text(text)
    return path


def _siblings(final: Path) -> list[str]:
    return sorted(p.name for p in final.parent.iterdir() if p != final)


def test_publishes_into_an_empty_place_and_over_an_old_directory(tmp_path: Path) -> None:
    final = tmp_path / "index"
    publish_dir(_dir(tmp_path / ".index.tmp", "one"), final)
    assert (final / "marker").read_text() == "one"
    publish_dir(_dir(tmp_path / ".index.tmp", "two"), final)
    assert (final / "marker").read_text() == "two"
    assert _siblings(final) == []  # neither the temp dir nor the old copy is left


def test_old_copies_a_killed_publish_left_are_removed(tmp_path: Path) -> None:
    final = _dir(tmp_path / "policy", "old")
    _dir(tmp_path / ".policy.old-0123abcd", "killed mid-publish")
    _dir(tmp_path / ".other.old-0123abcd", "not ours")
    publish_dir(_dir(tmp_path / ".policy.tmp", "new"), final)
    assert (final / "marker").read_text() == "new"
    assert _siblings(final) == [".other.old-0123abcd"]


def test_a_missing_temp_dir_fails_and_keeps_the_old_one(tmp_path: Path) -> None:
    final = _dir(tmp_path / "policy", "old")
    with pytest.raises(FileNotFoundError, match=r"\.policy\.tmp"):
        publish_dir(tmp_path / ".policy.tmp", final)
    assert (final / "marker").read_text() == "old"


@pytest.fixture
def no_exchange(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fallback where the filesystem cannot exchange two paths."""
    monkeypatch.setattr(io, "exchange_paths", lambda a, b: False)


@pytest.mark.usefixtures("no_exchange")
def test_fallback_replaces_and_leaves_nothing(tmp_path: Path) -> None:
    final = _dir(tmp_path / "step_3", "old")
    publish_dir(_dir(tmp_path / ".step_3.tmp", "new"), final)
    assert (final / "marker").read_text() == "new" and _siblings(final) == []


@pytest.mark.usefixtures("no_exchange")
def test_fallback_puts_the_old_directory_back_when_the_new_one_cannot_move_in(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    final = _dir(tmp_path / "step_3", "old")
    tmp = _dir(tmp_path / ".step_3.tmp", "new")
    real_rename = os.rename

    def rename(src: str | Path, dst: str | Path) -> None:
        if Path(src) == tmp:  # the swap's second rename: the new dir into place
            raise OSError(28, "No space left on device (simulated)")
        real_rename(src, dst)

    monkeypatch.setattr(os, "rename", rename)
    with pytest.raises(OSError, match="simulated"):
        publish_dir(tmp, final)
    assert (final / "marker").read_text() == "old"
    assert _siblings(final) == [".step_3.tmp"]  # the caller's temp dir, no old copy


READER = """
import os, sys, time
marker, stop = sys.argv[1], sys.argv[2]
seen = misses = 0
while not os.path.exists(stop):
    seen += 1
    misses += not os.path.exists(marker)
print(seen, misses)
"""


def test_a_concurrent_reader_never_finds_the_directory_missing(tmp_path: Path) -> None:
    probe_a, probe_b = _dir(tmp_path / "a", "a"), _dir(tmp_path / "b", "b")
    if not exchange_paths(probe_a, probe_b):
        pytest.skip("this filesystem cannot exchange two paths atomically")
    final = _dir(tmp_path / "index", "0")
    stop = tmp_path / "stop"
    reader = subprocess.Popen([sys.executable, "-c", READER, str(final / "marker"), str(stop)],
                              stdout=subprocess.PIPE, text=True)
    try:
        time.sleep(0.3)  # the reader is polling before the first swap
        for i in range(1, 201):
            publish_dir(_dir(tmp_path / ".index.tmp", str(i)), final)
    finally:
        stop.touch()
        out, _ = reader.communicate(timeout=30)
    seen, misses = map(int, out.split())
    assert (final / "marker").read_text() == "200" and _siblings(final) == ["a", "b", "stop"]
    assert seen > 0 and misses == 0


def test_a_streamed_file_replaces_the_old_one_only_when_complete(tmp_path: Path) -> None:
    path = tmp_path / "corpus.jsonl"
    path.write_bytes(b"old\n")
    with pytest.raises(RuntimeError, match="stream broke"), atomic_writer(path) as fh:
        fh.write(b"half")
        raise RuntimeError("stream broke")
    assert path.read_bytes() == b"old\n" and _siblings(path) == []
    with atomic_writer(path) as fh:
        fh.write(b"new\n")
    assert path.read_bytes() == b"new\n" and _siblings(path) == []
    assert path.stat().st_mode & 0o777 != 0o600  # mkstemp's private mode is not kept
