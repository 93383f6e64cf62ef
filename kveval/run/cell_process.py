"""The parent side of one cell: start its child process, relay its progress, and keep its result on disk.

The parent never imports vLLM. It writes a spec for the cell, starts `python -m kveval.worker.cell_main`
with the cell's log as stdout/stderr, follows its progress events, and — if the child dies
without finishing (segfault, OOM kill, timeout, a stall) — classifies the death from the log and stores
it, merged with whatever the child had already written. Given a `WarmProcess`, a cell whose environment
matches is handed to the process waiting there (already past its imports), and the next one is started
ahead (run/warm_process.py); everything after the hand-over is the same for a warm child as for a cold one.
"""
from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from pydantic import BaseModel, ConfigDict

from kveval import defaults
from kveval.files import schema
from kveval.run.death import explain_death, log_tail
from kveval.files.cell_spec import CellSpec, PhaseOptions
from kveval.files.startup_failure import StartupFailure, classify_startup_failure, not_started_record
from kveval.files.rundir import DISK_FULL_EXIT, NO_SPACE_WORDS, DiskFull, RunDir, StoreError, write_json_atomic
from kveval.inputs.kvspec import KVSpec
from kveval.run.fork_server import ForkedChild, ForkServer
from kveval.run.warm_process import WarmChild, WarmProcess


@dataclass
class CellPlan:
    id: str
    kv: KVSpec                        # the configuration the cell is named for (engine: what vLLM is given)
    max_model_len: int
    engine: dict[str, Any]            # EngineSettings fields
    phases: list[str]
    phase_options: PhaseOptions | None = None   # None only for cells whose phases take no options
    workloads: str | None = None      # the prompts file, relative to the run (None: workloads.json)

    def to_dict(self) -> dict:
        """The manifest's planned cell (schema.PlannedCell): the spec text is `kv_spec`, as in the cells."""
        return {"id": self.id, "kv_spec": self.kv.text, "max_model_len": self.max_model_len}

    @property
    def kv_cache_memory_bytes(self) -> int | None:
        """The KV budget the cell is started with; None: the device's own memory decides (a physical budget)."""
        return self.engine.get("kv_cache_memory_bytes")

    def with_memory(self, kv_cache_memory_bytes: int | None, cpu_offload_gb: float | None = None) -> "CellPlan":
        """The same cell on another KV budget and/or with weights offloaded to host memory (a quality
        reference, run/reference.py); vLLM's cpu_offload_gb travels with the other engine arguments."""
        engine = {**self.engine, "kv_cache_memory_bytes": kv_cache_memory_bytes}
        if cpu_offload_gb:
            engine["extra"] = {**(self.engine.get("extra") or {}), "cpu_offload_gb": cpu_offload_gb}
        return dataclasses.replace(self, engine=engine)


class CellEvent(BaseModel):
    """One line of a cell's progress events (worker/cell_main and its phases emit them): `phase` began,
    the engine's `outcome` (started, its pool or why not), a `step` of a phase (done of total, item)."""

    model_config = ConfigDict(extra="allow")
    event: str
    phase: Optional[str] = None
    started: Optional[bool] = None
    kv_pool_tokens: Optional[int] = None
    reason: Optional[str] = None
    done: Optional[int] = None
    total: Optional[int] = None
    item: Any = None


def _read_events(path: Path, offset: int) -> tuple[list[CellEvent], int]:
    try:
        with path.open("r", encoding="utf-8") as handle:
            handle.seek(offset)
            chunk = handle.read()
    except FileNotFoundError:
        return [], offset
    complete, _, _rest = chunk.rpartition("\n")  # a line still being written waits for next poll
    events = []
    for line in complete.splitlines():
        try:
            events.append(CellEvent.model_validate_json(line))
        except ValueError:   # a damaged line (pydantic's ValidationError is a ValueError)
            continue
    return events, offset + len(complete) + (1 if complete else 0)


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"  # so the log is complete when the child is killed
    env.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    return env


def cell_env(extra: dict[str, str | None] | None = None) -> dict[str, str]:
    """A cell process's whole environment: this one's, with `extra` on top (a None value removes a variable)."""
    return {k: v for k, v in {**_child_env(), **(extra or {})}.items() if v is not None}


class _ProgressWatch:
    """When did the started engine last report progress? Engine start-up is not watched (the cell
    timeout covers it: CUDA graph capture and compilation take minutes without events)."""

    def __init__(self) -> None:
        self.phase: str | None = None
        self.last: CellEvent | None = None
        self.since = time.monotonic()

    def saw(self, event: CellEvent) -> None:
        self.since = time.monotonic()
        if event.event == "phase":
            self.phase = event.phase
            self.last = None
        elif event.event == "step":
            self.last = event

    def stalled(self, stall_s: float | None) -> schema.Stalled | None:
        idle = time.monotonic() - self.since
        if stall_s is None or self.phase in (None, "engine_start", "done") or idle <= stall_s:
            return None
        last = self.last or CellEvent(event="step")
        return schema.Stalled(phase=self.phase, seconds=round(idle), done=last.done, total=last.total,
                              item=None if last.item is None else str(last.item))


def run_cell_process(run_dir: RunDir, plan: CellPlan, *, timeout_s: float | None,
                     on_event: Callable[[CellEvent], None], env: dict[str, str] | None = None,
                     stop: threading.Event | None = None,
                     stall_s: float | None = defaults.STALL_TIMEOUT_S, warm: WarmProcess | ForkServer | None = None) -> schema.CellResult:
    """Run one cell in its own process and return its stored record, typed. `env`: extra environment for the
    child (CUDA_VISIBLE_DEVICES when cells share a host's GPUs); `stop`: set by another thread to end the
    cell as interrupted (Ctrl-C while cells run in parallel). A None value in `env` removes that variable.
    `stall_s`: a started cell with no progress event for this long is stopped and recorded as stalled.
    `warm`: take its waiting process (or, from a ForkServer, a process forked for this cell) when it was
    started with this cell's environment, and start the next one there once this cell has its process."""
    spec = CellSpec(
        cell_id=plan.id, run_dir=str(run_dir.path.resolve()), engine=plan.engine, kv_spec=plan.kv.text,
        phases=plan.phases, phase_options=plan.phase_options,
        workloads_path=str((run_dir.path / plan.workloads if plan.workloads else run_dir.workloads_path).resolve()),
        result_path=str(run_dir.cell_path(plan.id).resolve()),
        events_path=str(run_dir.cell_events_path(plan.id).resolve()),
        log_path=str(run_dir.cell_log_path(plan.id).resolve()),
    )
    for stale in (run_dir.cell_path(plan.id), run_dir.cell_events_path(plan.id)):
        stale.unlink(missing_ok=True)
    write_json_atomic(run_dir.cell_spec_path(plan.id), spec.model_dump(mode="json"))
    timed_out = False
    stalled = None
    watch = _ProgressWatch()
    child_env = cell_env(env)
    spec_path = run_dir.cell_spec_path(plan.id).resolve()
    with run_dir.cell_log_path(plan.id).open("w", encoding="utf-8") as log:
        # The clock starts at the hand-over: a warm child's time spent waiting is not the cell's.
        began = time.monotonic()
        waiting = warm.take(child_env) if warm is not None else None
        if waiting is not None and not waiting.hand_over(spec_path):
            waiting = None
        if waiting is not None:
            child = waiting.process
        else:
            child = subprocess.Popen(
                [sys.executable, "-m", "kveval.worker.cell_main", str(spec_path)],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=child_env,
            )
        is_warm = waiting is not None
        forked = is_warm and waiting.forked
        offset = 0
        try:
            if warm is not None:   # in the try: a Ctrl-C now still stops this cell's process
                warm.prestart(child_env)   # the next cell's imports overlap this cell's work
            while child.poll() is None:
                events, offset = _read_events(run_dir.cell_events_path(plan.id), offset)
                for event in events:
                    watch.saw(event)
                    on_event(event)
                if timeout_s is not None and time.monotonic() - began > timeout_s:
                    timed_out = True
                    _kill_group(child)
                    break
                stalled = watch.stalled(stall_s)
                if stalled is not None:
                    _dump_stacks(child)
                    _kill_group(child)
                    break
                if stop is not None and stop.is_set():
                    _kill_group(child)
                    _keep_waiting_output(waiting, run_dir.cell_log_path(plan.id))
                    return _finish(run_dir, plan, child.returncode, False, timeout_s, time.monotonic() - began,
                                   interrupted=True, warm=is_warm, forked=forked)
                time.sleep(0.3)
        except KeyboardInterrupt:
            # Stop the cell, and say in its file that it was interrupted (a resume redoes it).
            _kill_group(child)
            _keep_waiting_output(waiting, run_dir.cell_log_path(plan.id))
            _finish(run_dir, plan, child.returncode, False, timeout_s, time.monotonic() - began, interrupted=True,
                    warm=is_warm, forked=forked)
            raise
        child.wait()
    _end_orphans(child)
    _keep_waiting_output(waiting, run_dir.cell_log_path(plan.id))
    events, offset = _read_events(run_dir.cell_events_path(plan.id), offset)
    for event in events:
        on_event(event)
    return _finish(run_dir, plan, child.returncode, timed_out, timeout_s, time.monotonic() - began, stalled=stalled,
                   warm=is_warm, forked=forked)


def _keep_waiting_output(waiting: WarmChild | ForkedChild | None, log_path: Path) -> None:
    if waiting is not None:
        waiting.keep_output(log_path)


def _end_orphans(child: subprocess.Popen) -> None:
    """A helper the engine spawned may outlive the cell's main process and hold memory: end the group."""
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _dump_stacks(child: subprocess.Popen) -> None:
    """Ask a stalled cell for its threads' stacks (cell_main registers SIGUSR1 with faulthandler): the log
    then shows where the engine hung."""
    try:
        os.kill(child.pid, signal.SIGUSR1)
        time.sleep(2.0)
    except (ProcessLookupError, PermissionError):
        pass


def _kill_group(child: subprocess.Popen) -> None:
    # The engine may have spawned helpers of its own: end the whole process group.
    try:
        os.killpg(child.pid, signal.SIGTERM)
        child.wait(timeout=15)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(child.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


class _Written(BaseModel):
    """How far the cell's own record got (the child may have died before writing all of it)."""

    model_config = ConfigDict(extra="ignore")
    started: Optional[bool] = None
    complete: bool = False


def _finish(run_dir: RunDir, plan: CellPlan, exit_code: int | None, timed_out: bool, timeout_s, seconds: float,
            *, interrupted: bool = False, stalled: schema.Stalled | None = None, warm: bool = False,
            forked: bool = False) -> schema.CellResult:
    written = run_dir.load_cell(plan.id, validate=False)
    progress = _Written.model_validate(written) if isinstance(written, dict) else _Written()
    if written is not None and progress.complete and not interrupted and stalled is None:
        process = {"exit_code": exit_code, "seconds": seconds, "warm": warm, "forked": forked}
        return stored_cell(run_dir, plan.id, {**written, "process": process})
    try:
        log = run_dir.cell_log_path(plan.id).read_text(encoding="utf-8", errors="replace")
    except OSError:
        log = ""
    if not interrupted and (exit_code == DISK_FULL_EXIT or any(words in log_tail(log, 40) for words in NO_SPACE_WORDS)):
        # The cell died writing to a full disk: stop the run (nothing is recorded for this cell, so the
        # resume after space is freed measures it again) rather than fill the review with failures.
        raise DiskFull(run_dir.cell_path(plan.id))
    death = explain_death(exit_code, timed_out=timed_out, timeout_s=timeout_s, stopped_by_user=interrupted,
                          kv_cache_memory_bytes=plan.kv_cache_memory_bytes, log_tail=log_tail(log, 40),
                          stalled=stalled)
    if written is None or not progress.started:
        # Died before the engine was up: a start-up failure, in vLLM's words if it left any.
        if interrupted:
            failure = StartupFailure("interrupted", death.message, None, None)
        else:
            failure = classify_startup_failure(
                log, exception_text="" if timed_out else death.message,
                kv_cache_dtype=plan.engine.get("kv_cache_dtype", plan.kv.dtype), exit_code=exit_code)
            if timed_out:  # say first that kveval stopped it; whatever vLLM logged follows
                failure = dataclasses.replace(failure, message=f"{death.message}. {failure.message}".strip())
        record = not_started_record(plan.id, plan.kv.text, plan.max_model_len, failure, log)
    else:
        # Started, then died in a phase: keep every finished phase, mark the rest as lost.
        crash = {"message": death.message, "cause": death.cause, "advice": death.advice,
                 "last_log_line": _last_line(log), "log_tail": log_tail(log),
                 **({"stalled": schema.dump(stalled)} if stalled is not None else {})}
        record = {**written, "crash": crash}
    process = {"exit_code": exit_code, "seconds": seconds, "timed_out": timed_out, "interrupted": interrupted,
               "cause": death.cause, "warm": warm, "forked": forked}
    return stored_cell(run_dir, plan.id, {**record, "complete": True, "process": process})


def stored_cell(run_dir: RunDir, cell: str, record: dict) -> schema.CellResult:
    """Write the cell's final record (what the child wrote and what the parent saw of its end) and give it
    back typed, validated as a cell file is when read; the run directory keeps it, so the next read is no parse."""
    write_json_atomic(run_dir.cell_path(cell), record, compact=True)
    try:
        typed = schema.parse(schema.CellResult, record, str(run_dir.cell_path(cell)))
    except schema.FileError as error:
        raise StoreError(str(error)) from None
    run_dir.remember_cell(cell, typed)
    return typed


def _last_line(log: str) -> str:
    lines = [line for line in log.strip().splitlines() if line.strip()]
    return lines[-1][-500:] if lines else ""
