"""One process at a time on a directory or file that a step reads, changes and writes back.

`held(target, ...)` holds an flock on `<target>.lock`, next to the target (which may be
replaced by a rename while held), for the block: training's checkpoint dir, a stage dir that
the stage clears (evaluate, gate), the stewards' overrides file (apply-audit). The kernel
drops the lock when the process ends, however it ends, so a crash never leaves it stuck. The
lock file names its holder (pid, host, since when) for the error a second process gets;
with `wait_s` the second process waits that long for its turn (serialised) before refusing.
Re-entrant within one process (a stage and its rank 0 in the same process).
"""

from __future__ import annotations

import fcntl
import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

LOCK_SUFFIX = ".lock"
_held: dict[Path, list[int]] = {}  # lock file -> [fd, depth]
_held_guard = threading.Lock()
_POLL_S = 0.1


class BusyError(RuntimeError):
    """Another live process holds the lock; the message names it and what to do."""


def lock_path(target: Path) -> Path:
    target = Path(target).resolve()
    return target.with_name(target.name + LOCK_SUFFIX)


@contextmanager
def held(target: Path, *, busy: str, wait_s: float = 0.0,
         error: type[Exception] = BusyError) -> Iterator[Path]:
    """Hold `target`'s lock for the block. When another process holds it, wait up to
    `wait_s` seconds, then raise `error` with `busy` (what the holder does) and the holder."""
    path = lock_path(target)
    with _held_guard:
        if path in _held:
            _held[path][1] += 1
        else:
            _held[path] = [_acquire(path, busy, wait_s, error), 1]
    try:
        yield path
    finally:
        with _held_guard:
            entry = _held[path]
            entry[1] -= 1
            if entry[1] == 0:
                del _held[path]
                os.ftruncate(entry[0], 0)
                os.close(entry[0])  # drops the flock


def _acquire(path: Path, busy: str, wait_s: float, error: type[Exception]) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() < deadline:
                time.sleep(_POLL_S)
                continue
            os.close(fd)
            holder = path.read_text().strip() or "a process that is still starting"
            waited = f" (waited {wait_s:g} s)" if wait_s > 0 else ""
            raise error(f"{path}: {busy} ({holder}){waited}; wait for it to end or stop "
                        "it, then re-run") from None
    os.ftruncate(fd, 0)
    os.write(fd, f"pid {os.getpid()} on {socket.gethostname()} since "
                 f"{time.strftime('%Y-%m-%d %H:%M:%S')}\n".encode())
    return fd
