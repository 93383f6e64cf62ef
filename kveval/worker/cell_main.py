"""One cell = one child process = one vLLM engine: start it, then run the phases in order.

Run as `python -m kveval.worker.cell_main SPEC.json`. The parent (run/cell_process.py) sends this process's stdout and
stderr to the cell's log, where vLLM writes its own words; a start-up failure is classified from
that log. The result file is rewritten atomically after start-up and after every phase, so a crash
in a late phase keeps what the earlier phases measured.

Warm (issue 18; run/warm_process.py): `python -m kveval.worker.cell_main --warm LOG [--no-lm-eval]` imports vLLM
and torch (or the fake engine), the phases and (unless the run has no tasks phase) lm-eval ahead, touching no device (vLLM's import reads the GPUs through NVML, which
makes no CUDA context), then reads one line on stdin, the spec's path: its output so far (LOG) goes to the
head of the cell's log, stdout and stderr are pointed at that log, and the cell runs as a cold one does.
EOF on stdin (no cell came, or the parent is gone) ends it with 0.

Fork server (issue 18; run/fork_server.py): `python -m kveval.worker.cell_main --serve LOG FD [--no-lm-eval]` imports the same
once, then reads spec paths on stdin, one per cell: for each it forks a process that starts a session of its
own, points fds 1 and 2 at the cell's log (after what the server printed while importing, as a cold child's
log would begin), runs the cell exactly as a cold child does and ends with `os._exit`. The server writes
`unsafe` (and ends: see _fork_is_safe) or `ready` (imports done), `start PID` and `exit PID CODE` (CODE as subprocess gives it: -N for signal N) to FD, and serves the next
spec only once the cell's process has ended. A line `job PATH` (files/cell_spec.ForkedJob) forks a process
that runs a module's `main(argv)` instead, the K/V range pass (run/diagnosis.py); while it runs, no cell
being timed, the server may import lm-eval. Every cell is still a process of its own (a crash, a kill or
the OOM killer ends that cell only); what it no longer pays is the ~7 s (2-core CPU) of importing torch
and vLLM, and lm-eval's import. The server touches no device: vLLM's import reads GPUs through NVML only.
"""
from __future__ import annotations

import atexit
import faulthandler
import importlib
import json
import os
import select
import signal
import sys
import time
import traceback
from pathlib import Path

from kveval.files import schema
from kveval.files.cell_spec import JOB_PREFIX, CellSpec, ForkedJob
from kveval.files.schema import CELL_VERSION
from kveval.files.startup_failure import classify_startup_failure, detect_backend, not_started_record
from kveval.files.logfacts import kv_pool_from_log
from kveval.worker.engine_clock import EngineClock
from kveval.worker.phases.context import CellContext
from kveval.files.rundir import DISK_FULL_EXIT, DiskFull, RunDir, read_json, write_json_atomic
from kveval.inputs.workloads import PromptSpec


_ENDED_WITH_THE_PROCESS: list = []   # engines whose process ends with os._exit (run_cell)


class _Events:
    """Progress events, one JSON line each, appended to a file the parent polls."""

    def __init__(self, path: Path):
        self.path = path

    def __call__(self, **event) -> None:
        event["t"] = time.time()
        with self.path.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(event) + "\n")


def _log_text(spec: CellSpec) -> str:
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        return Path(spec.log_path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def _engine_module():
    """worker/engine.py, the only vLLM import (after the env is set up); or, with KVEVAL_ENGINE=fake in
    the cell's environment, the tests' stand-in of the same surface (worker/fake_engine.py)."""
    if os.environ.get("KVEVAL_ENGINE") == "fake":
        from kveval.worker import fake_engine
        return fake_engine
    from kveval.worker import engine
    return engine


class _CellFile:
    """The cell's result file as the cell goes: the started engine's facts (typed) and its phases. A finished
    phase is put in the file's form once (a scoring phase holds hundreds of thousands of positions), not at
    every write; the file is rewritten atomically after each phase, so a crash keeps the earlier ones."""

    def __init__(self, path: Path, facts: schema.CellResult):
        self.path, self.facts = path, facts
        self.phases: dict[str, schema.Phase] = {}   # by name, in the order they ran (the file's order)
        self._stored: dict[str, dict] = {}

    def keep(self, name: str, phase: schema.Phase) -> None:
        self.phases[name] = phase
        self._stored[name] = schema.dump(phase)
        self.write()

    def write(self) -> None:
        write_json_atomic(self.path, {**schema.dump(self.facts), "phases": self._stored}, compact=True)


def run_cell(spec: CellSpec) -> None:
    from kveval.worker.phases import PHASES, RECORDS

    engine_module = _engine_module()

    result_path = Path(spec.result_path)
    emit = _Events(Path(spec.events_path))
    settings = engine_module.EngineSettings(**spec.engine)
    # The pid lets an operator (or the fault-injection tests) find this cell's process.
    emit(event="phase", phase="engine_start", pid=os.getpid())
    began = time.perf_counter()
    try:
        engine = engine_module.Engine.start(settings)
    except BaseException as error:  # noqa: BLE001 - every way of failing to start is a finding
        if isinstance(error, KeyboardInterrupt):
            raise
        traceback.print_exc()
        log = _log_text(spec)
        failure = classify_startup_failure(
            log, exception_text=f"{type(error).__name__}: {error}", kv_cache_dtype=settings.kv_cache_dtype
        )
        # The KV spec as the user named it (e.g. fp8:keep=0): what the cell id says it is.
        record = not_started_record(
            spec.cell_id, spec.kv_spec, settings.max_model_len, failure, log,
            engine_settings=settings.llm_kwargs(), startup_seconds=time.perf_counter() - began,
            info={"vllm_version": engine_module.vllm_version(), **engine_module.platform_facts()})
        write_json_atomic(result_path, record, compact=True)
        emit(event="outcome", started=False, reason=failure.reason)
        return

    info = schema.CellInfo.model_validate(engine.info())
    if info.attention_backend is None:
        info.attention_backend = detect_backend(_log_text(spec))
    cell_file = _CellFile(result_path, schema.CellResult(
        schema_version=CELL_VERSION,   # first, as in every cell file kveval writes (files/schema/cell.py)
        cell=spec.cell_id, kv_spec=spec.kv_spec, max_model_len=settings.max_model_len,
        engine_settings=schema.EngineSettings.model_validate(settings.llm_kwargs()), complete=False,
        phases=schema.Phases(), started=True, startup_seconds=engine.startup_seconds,
        capacity=schema.Capacity.model_validate(engine.capacity()), info=info,
        logged_capacity=schema.LoggedCapacity.model_validate(kv_pool_from_log(_log_text(spec)))))
    cell_file.write()
    emit(event="outcome", started=True, kv_pool_tokens=cell_file.facts.capacity.kv_pool_tokens)

    prompts = [PromptSpec.from_dict(item) for item in read_json(Path(spec.workloads_path))]
    context = CellContext(
        cell_id=spec.cell_id, kv_spec=spec.kv_spec, max_model_len=settings.max_model_len,
        prompts=prompts, options=spec.phase_options, emit=emit, capacity=cell_file.facts.capacity,
        finished=cell_file.phases, run_dir=RunDir(spec.run_dir), model_path=settings.model,
        checkpoint=cell_file.write, keep_partial=cell_file.keep,
    )
    # The phases see the engine through a clock: each phase's time inside engine calls is its
    # `engine_seconds`, the rest of its time is kveval's own (issue 18).
    clock = EngineClock(engine)
    for name in spec.phases:
        emit(event="phase", phase=name)
        began = time.perf_counter()
        clock.lap()
        try:
            outcome = PHASES[name](clock, context)
            outcome.seconds = time.perf_counter() - began
            outcome.engine_seconds = round(clock.lap()[0], 4)
        except Exception as error:  # noqa: BLE001 - one broken phase must not lose the others
            if isinstance(error, DiskFull):   # not the phase's fault: the run stops (main)
                raise
            traceback.print_exc()
            failed, seconds = f"{type(error).__name__}: {error}", time.perf_counter() - began
            # Keep what a phase that saves as it goes had stored before it broke, then its error and time.
            outcome = cell_file.phases.get(name) or RECORDS[name](error=failed, seconds=seconds)
            outcome.error, outcome.seconds = failed, seconds
        cell_file.keep(name, outcome)
    cell_file.facts.complete = True
    cell_file.write()
    emit(event="phase", phase="done")
    if _one_process_engine(spec):
        # Not torn down when this returns: the process ends right after with os._exit (main, _forked_cell),
        # and vLLM's shutdown in the engine's destructor took 1.2-1.5 s of every cell on the 2-core CPU.
        _ENDED_WITH_THE_PROCESS.append(engine)


def _wait_for_spec(waiting_log: Path, lm_eval: bool = True) -> CellSpec | None:
    """Warm: import what a cell needs, then wait for the spec's path; None on EOF. `lm_eval` False (a run
    without a tasks phase): lm-eval is not imported ahead."""
    from kveval.worker import phases

    _engine_module()
    # lm-eval too, while nothing waits for this process: a cell handed over already gets what a cold one does.
    if lm_eval and not select.select([sys.stdin], [], [], 0)[0]:
        phases.tasks.preload()
    line = sys.stdin.readline().strip()
    if not line:
        return None
    spec = CellSpec.model_validate(read_json(Path(line)))
    sys.stdout.flush()
    sys.stderr.flush()
    # The parent has created (truncated) the cell's log; what was printed while importing goes first.
    with open(spec.log_path, "ab") as log:
        try:
            log.write(waiting_log.read_bytes())
            log.flush()
            waiting_log.unlink()   # copied: the parent adds it to the cell's log only if still there
        except OSError:
            pass
        # Descriptors, not sys.stdout: vLLM's log handlers and C-level output write to fds 1 and 2.
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
    return spec


def main(argv: list[str]) -> int:
    warm = len(argv) in (2, 3) and argv[0] == "--warm" and argv[2:] in ([], ["--no-lm-eval"])
    serve = len(argv) in (3, 4) and argv[0] == "--serve" and argv[2].isdigit() and argv[3:] in ([], ["--no-lm-eval"])
    if len(argv) != 1 and not (warm or serve):
        print("usage: python -m kveval.worker.cell_main SPEC.json | --warm LOG [--no-lm-eval] | --serve LOG FD [--no-lm-eval]",
              file=sys.stderr)
        return 2
    # A parent that finds this cell stalled sends SIGUSR1 first: every thread's Python stack goes to the
    # cell's log, which then shows where the engine hung (fd 2, whichever file it points at by then).
    faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)
    if serve:
        return _serve(Path(argv[1]), int(argv[2]), lm_eval=argv[3:] != ["--no-lm-eval"])
    if warm:
        spec = _wait_for_spec(Path(argv[1]), lm_eval=argv[2:] != ["--no-lm-eval"])
        if spec is None:
            return 0
    else:
        spec = CellSpec.model_validate(read_json(Path(argv[0])))
    code = _run_spec(spec)
    if code == 0 and _one_process_engine(spec):
        # The record is on disk and the parent ends the process group after this exit anyway; vLLM's and
        # torch's teardown took 4.5 s of every cell process on the 2-core CPU (0.2 s this way; issue 18).
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    return code


def _run_spec(spec: CellSpec) -> int:
    try:
        run_cell(spec)
    except DiskFull as error:
        # The exit code tells the parent even when the full disk swallows this line in the log.
        print(f"kveval cell: {error}", file=sys.stderr, flush=True)
        return DISK_FULL_EXIT
    return 0


def _serve(server_log: Path, report_fd: int, lm_eval: bool = True) -> int:
    """Fork server (module doc): import once, then one forked process per spec path read on stdin.
    `lm_eval` False (a run without a tasks phase): lm-eval is not imported ahead."""
    from kveval.worker import phases

    report = os.fdopen(report_fd, "w", buffering=1)
    _engine_module()
    if not _fork_is_safe():
        report.write("unsafe\n")   # the parent then starts every cell cold
        return 0
    preloaded, ready = not lm_eval, False
    while True:
        if not preloaded and not select.select([sys.stdin], [], [], 0)[0]:
            phases.tasks.preload()   # only while no cell waits: the first cell is not held up for it
            preloaded = True
        if preloaded and not ready:
            report.write("ready\n")
            ready = True
        line = sys.stdin.readline().strip()
        if not line:
            return 0
        job = line.startswith(JOB_PREFIX)
        sys.stdout.flush()   # nothing buffered here may be written twice, by the server and by the cell
        sys.stderr.flush()
        server = os.getpid()
        pid = os.fork()
        if pid == 0:
            os._exit(_forked_job(Path(line[len(JOB_PREFIX):]), report, server) if job
                     else _forked_cell(Path(line), server_log, report, server))
        report.write(f"start {pid}\n")
        if job and not preloaded:   # no cell is being timed: lm-eval's import may overlap the job
            phases.tasks.preload()
            preloaded = True
        _, status = os.waitpid(pid, 0)
        report.write(f"exit {pid} {os.waitstatus_to_exitcode(status)}\n")


def _end_with(server: int) -> None:
    """SIGKILL this process when the server ends (Linux PR_SET_PDEATHSIG): the parent ends the server at
    Ctrl-C or when a hand-over fails, and a cell it forked just then must not run on unseen."""
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)   # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != server:   # the server was gone before the call above
        os._exit(1)


def _fork_is_safe() -> bool:
    """A forked process could not use CUDA if an import here had initialised it (torch then marks every
    fork "bad"): one probe fork says so before any cell is forked."""
    torch = sys.modules.get("torch")
    if torch is None:
        return True
    pid = os.fork()
    if pid == 0:
        os._exit(1 if torch.cuda._is_in_bad_fork() else 0)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) == 0


def _leave_the_server(report, server: int) -> None:
    """A forked process's first steps: no reports, a session of its own, ended with the server, stdin closed."""
    report.close()           # only the server reports; the parent sees EOF once the server is gone
    os.setsid()              # a process group of its own: the parent ends the cell's group, not the server
    _end_with(server)
    quiet = os.open(os.devnull, os.O_RDONLY)
    os.dup2(quiet, 0)
    os.close(quiet)


def _forked_job(job_path: Path, report, server: int) -> int:
    """A forked process that runs a module's main(argv) (files/cell_spec.ForkedJob) instead of a cell: its own
    session, ended with the server, stdout and stderr in the job's log; its exit code is main's."""
    code = 1
    try:
        _leave_the_server(report, server)
        job = ForkedJob.model_validate(read_json(job_path))
        with open(job.log_path, "ab") as log:
            os.dup2(log.fileno(), 1)
            os.dup2(log.fileno(), 2)
        sys.argv = [job.module, *job.argv]
        result = importlib.import_module(job.module).main(job.argv)
        code = result if isinstance(result, int) else 0
    except SystemExit as end:   # argparse's errors
        code = end.code if isinstance(end.code, int) else 1
    except BaseException:  # noqa: BLE001 - whatever ends this process, it must not run the server's loop
        traceback.print_exc()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:  # noqa: BLE001
        pass
    return code


def _forked_cell(spec_path: Path, server_log: Path, report, server: int) -> int:
    """The forked cell process: its own session, stdin from /dev/null, fds 1 and 2 on the cell's log, ended
    with the server; never returns into the server's loop (the caller ends it with os._exit)."""
    code, spec = 1, None
    try:
        _leave_the_server(report, server)
        spec = CellSpec.model_validate(read_json(spec_path))
        with open(spec.log_path, "ab") as log:
            try:
                log.write(server_log.read_bytes())   # the imports' words, where a cold child's log has them
                log.flush()
            except OSError:
                pass
            os.dup2(log.fileno(), 1)
            os.dup2(log.fileno(), 2)
        code = _run_spec(spec)
    except BaseException:  # noqa: BLE001 - whatever ends this process, it must not run the server's loop
        traceback.print_exc()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
        if spec is not None and not _one_process_engine(spec):
            atexit._run_exitfuncs()   # parallel engine workers are shut down as a normal exit would
    except BaseException:  # noqa: BLE001
        pass
    return code


_PARALLEL_ARGS = ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size")


def _one_process_engine(spec: CellSpec) -> bool:
    """The engine ran inside this process (no worker processes, no shared memory to release): the
    default, one device per cell. With parallel workers the normal exit shuts them down cleanly."""
    extra = (spec.engine or {}).get("extra") or {}
    return all(str(extra.get(name, 1)).strip() in ("1", "0", "None", "") for name in _PARALLEL_ARGS)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
