"""Cell processes started ahead (issue 18): while one cell runs, the next cell's process is already
importing torch and vLLM (~20 s of every cell), and waits, touching no device, until it is handed a spec.

A `WarmProcess` holds at most one waiting child: `python -m kveval.worker.cell_main --warm LOG`, in a
session of its own like every cell process, its output in LOG (cells/.warm-<n>.log, copied to the head of
the cell's log when it gets a cell). It is keyed by the exact environment and Python it was started with:
`take(env)` gives it only to a cell that would have started with the same, otherwise a cell starts cold
as before. `close()` ends the waiting child; if the parent dies, the child reads EOF on its stdin and exits.

Only cells run one after another on this host use it (not --executor ray, not cells at once on several
devices), and by default only where the host has a GPU: there the import runs on otherwise idle cores.
On a CPU-only host the engine takes every core, so an import beside it only slows the running cell (on
2 cores the wall time did not change, within noise, and each waiting child held ~0.9 GB) and could
overlap its speed measurement. `KVEVAL_WARM_CELLS=1` turns it on anywhere, `0` off anywhere.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

SWITCH = "KVEVAL_WARM_CELLS"


def warm_cells_enabled(gpu_host: bool) -> bool:
    """On by default where the host has a GPU (module doc); KVEVAL_WARM_CELLS=1/0 decides otherwise."""
    switch = os.environ.get(SWITCH, "").strip()
    return gpu_host if switch not in ("0", "1") else switch == "1"


@dataclass
class WarmChild:
    process: subprocess.Popen
    python: str
    env: dict[str, str]
    log: Path                # its output until it is handed a cell
    forked = False           # (run/fork_server.ForkedChild: True)

    def hand_over(self, spec_path: Path) -> bool:
        """Send the spec path; False when the child is gone (the caller then starts one cold)."""
        try:
            self.process.stdin.write(f"{spec_path}\n".encode())
            self.process.stdin.close()
        except OSError:   # BrokenPipeError: it died while it waited
            self.end()
            return False
        return True

    def keep_output(self, log_path: Path) -> None:
        """The child copies what it printed while waiting to the head of the cell's log and removes its own
        log; one that died first (an import that failed) left it: its words go to the cell's log, where a
        cold child would have written them and where the death is classified from."""
        if not self.log.exists():
            return
        try:
            with log_path.open("ab") as log:
                log.write(self.log.read_bytes())
            self.log.unlink(missing_ok=True)
        except OSError:
            pass

    def end(self) -> None:
        """End its process group (SIGTERM, then SIGKILL) and remove its waiting log."""
        end_waiting_process(self.process)
        self.log.unlink(missing_ok=True)


def end_waiting_process(process: subprocess.Popen) -> None:
    """A process waiting on its stdin (a warm child, the fork server): EOF on its stdin, then SIGTERM and,
    after 5 s, SIGKILL to its process group."""
    if process.stdin is not None and not process.stdin.closed:
        try:
            process.stdin.close()
        except OSError:
            pass
    if process.poll() is None:
        try:
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(timeout=5)
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            process.wait()


class WarmProcess:
    """At most one cell process waiting for its cell; not thread-safe (cells one after another)."""

    def __init__(self, directory: Path, lm_eval: bool = True):
        self.directory = directory
        self.lm_eval = lm_eval   # the child imports lm-eval ahead (False: a run without a tasks phase)
        self.child: WarmChild | None = None
        self.started = 0

    def take(self, env: dict[str, str]) -> WarmChild | None:
        """The waiting child if it was started with exactly `env` and this Python and still lives; else
        None (and a mismatching or dead one is ended)."""
        child, self.child = self.child, None
        if child is None:
            return None
        if child.python == sys.executable and child.env == env and child.process.poll() is None:
            return child
        child.end()
        return None

    def prestart(self, env: dict[str, str]) -> None:
        """Start a child for the next cell (ending one that still waits)."""
        self.close()
        self.started += 1
        log = self.directory / f".warm-{self.started}.log"
        self.directory.mkdir(parents=True, exist_ok=True)
        with log.open("w", encoding="utf-8") as output:
            process = subprocess.Popen(
                [sys.executable, "-m", "kveval.worker.cell_main", "--warm", str(log.resolve()),
                 *([] if self.lm_eval else ["--no-lm-eval"])],
                stdin=subprocess.PIPE, stdout=output, stderr=subprocess.STDOUT, start_new_session=True, env=env)
        self.child = WarmChild(process, sys.executable, dict(env), log)

    def close(self) -> None:
        child, self.child = self.child, None
        if child is not None:
            child.end()

    def __enter__(self) -> "WarmProcess":
        return self

    def __exit__(self, *_exc) -> None:
        self.close()
