"""One live run per run directory: `compare` holds an OS lock on DIR/.kveval.lock from before its first
write until it returns, so a second run into the same --out is refused at once instead of planning the
same cells and overwriting the first run's files.

An OS file lock (flock), not a pid file: the kernel drops it when the holder dies, however it dies, so a
killed run never blocks the resume that follows. The file itself stays; it only names the last holder
(pid and command) for the message a refused run prints.
"""
from __future__ import annotations

import fcntl
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

LOCK_NAME = ".kveval.lock"


class RunDirBusy(Exception):
    """Another live kveval run holds the run directory."""


@dataclass
class RunLock:
    path: Path
    fd: int
    created_dir: bool = False   # acquire made the run directory

    def release(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)   # closing the descriptor drops the flock
            self.fd = -1

    def discard(self) -> None:
        """Release, for a run refused before it wrote anything: a directory this lock made and that
        holds nothing else is removed, so a refused run leaves no trace."""
        self.release()
        directory = self.path.parent
        try:
            if self.created_dir and [p.name for p in directory.iterdir()] == [LOCK_NAME]:
                self.path.unlink()
                directory.rmdir()
        except OSError:
            pass


def _holder(path: Path) -> str:
    """"pid N: COMMAND" from the lock file, or a plain phrase when it cannot be read."""
    try:
        facts = json.loads(path.read_text(encoding="utf-8") or "{}")
        return f"pid {facts['pid']}: {facts['command']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "a process that has not written its name yet"


def acquire(run_dir: Path) -> RunLock:
    """The run directory's lock for this process (the directory is created); RunDirBusy when a live run
    holds it."""
    created = not run_dir.exists()
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / LOCK_NAME
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise RunDirBusy(f"{run_dir} is being written by another kveval run ({_holder(path)}); wait for it to "
                         "finish (then the same command resumes it), or give another --out") from None
    os.ftruncate(fd, 0)
    os.write(fd, json.dumps({"pid": os.getpid(), "command": " ".join(sys.argv)}).encode("utf-8"))
    return RunLock(path, fd, created)


def live_writer(run_dir: Path) -> str | None:
    """"pid N: COMMAND" of a live run of another process holding the directory, else None."""
    path = run_dir / LOCK_NAME
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _holder(path)
        return None if holder.startswith(f"pid {os.getpid()}:") else holder
    finally:
        os.close(fd)   # also drops the shared lock just taken
    return None
