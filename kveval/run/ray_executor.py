"""Cells as Ray tasks (`--executor ray`): each cell's process runs on a Ray node that has the devices
it needs, and its files end up in the run directory on the driver, laid out as in a local run.

Ray is an optional extra (`pip install 'kveval[ray]'`), imported only in this module. A task does
what a local cell does — `run_cell_process` starts the cell's own process there, with its timeout —
so results, logs and failure records are the same. Ray sets CUDA_VISIBLE_DEVICES for the task's
`num_gpus`, and the cell process inherits it.

Files: when the node sees the run directory (a shared filesystem: the same manifest bytes at the
same path), the cell writes there directly. Otherwise the driver sends what a cell reads (manifest,
prompts, scoring documents, task data, finished cells' results) and the task sends the cell's
files back. The model must be readable at the same path on every node (or be a hub id).

Progress events and Ctrl-C travel through one small actor: events to the driver, and a stop flag
that makes every running cell end as `interrupted`, recorded like a local run's.
"""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import signal
import socket
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from pydantic import BaseModel, ConfigDict

from kveval.errors import KvevalError
from kveval.files import schema
from kveval.files.rundir import RunDir, write_bytes_atomic
from kveval.run.cell_process import CellEvent, CellPlan, run_cell_process, stored_cell
from kveval.files.startup_failure import StartupFailure, not_started_record

# Environment the cells' engines read: sent to every node so a cell behaves as it would locally.
_FORWARDED_ENV_PREFIXES = ("VLLM_", "HF_", "TRANSFORMERS_")


def _import_ray():
    try:
        import ray
    except ImportError:
        raise KvevalError("--executor ray needs Ray: pip install 'kveval[ray]' (or pip install ray)") from None
    return ray


class _Signals:
    """Ray actor (created in RayCells): cells' progress events for the driver, and the stop flag."""

    def __init__(self):
        self._events: dict[str, list[CellEvent]] = {}
        self._stopped = False

    def event(self, cell: str, event: CellEvent) -> None:
        self._events.setdefault(cell, []).append(event)

    def drain(self, cell: str) -> list[CellEvent]:
        return self._events.pop(cell, [])

    def stop(self) -> None:
        self._stopped = True

    def stopped(self) -> bool:
        return self._stopped


def check_reachable(address: str | None, timeout_s: float = 5.0) -> None:
    """A HOST:PORT (or ray://HOST:PORT) that nothing answers on is refused here: ray.init would retry
    it for ever. `auto`, `local` and None are Ray's to resolve."""
    match = re.fullmatch(r"(?:ray://)?\[?([^\]/]+?)\]?:(\d+)/?", (address or "").strip())
    if not match:
        return
    host, port = match.group(1), int(match.group(2))
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
    except OSError as error:
        raise KvevalError(f"--ray-address {address}: nothing answers at {host}:{port} ({error.strerror or error}); "
                          "start the cluster (ray start --head) or give its address") from None


def _signal_handlers() -> dict:
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {number: signal.getsignal(number) for number in (signal.SIGINT, signal.SIGTERM)}


def _restore_signal_handlers(handlers: dict) -> None:
    for number, handler in handlers.items():
        if handler is not None:
            signal.signal(number, handler)


def run_input_files(run_dir: RunDir) -> dict[str, bytes]:
    """What a cell reads from its run directory, by relative path: the manifest, prompts (later rounds'
    probes too), scoring documents, task data and the results of cells already finished (the scoring reference's outputs)."""
    root = run_dir.path
    paths = [run_dir.manifest_path, run_dir.workloads_path, run_dir.scoring_path]
    paths += sorted((root / RunDir.TASK_DATA_DIR).rglob("*")) if (root / RunDir.TASK_DATA_DIR).is_dir() else []
    paths += sorted((root / RunDir.ROUNDS_DIR).glob("*.json")) if (root / RunDir.ROUNDS_DIR).is_dir() else []
    paths += [p for p in sorted(run_dir.cells_dir.glob("*.json")) if not p.name.endswith(".spec.json")] \
        if run_dir.cells_dir.is_dir() else []
    return {str(p.relative_to(root)): p.read_bytes() for p in paths if p.is_file()}


def cell_files(run_dir: RunDir, cell: str) -> dict[str, bytes]:
    """One cell's files, by relative path: its result, log and progress events."""
    paths = (run_dir.cell_path(cell), run_dir.cell_log_path(cell), run_dir.cell_events_path(cell))
    return {str(p.relative_to(run_dir.path)): p.read_bytes() for p in paths if p.is_file()}


def unpack_files(files: dict[str, bytes], root: Path) -> None:
    for relative, data in files.items():
        target = (root / relative).resolve()
        if root.resolve() not in target.parents:  # never outside the run directory
            raise ValueError(f"{relative}: not inside {root}")
        write_bytes_atomic(target, data)


def _digest(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def _value(ref, timeout_s: float = 120.0):
    """An object's value without ray.get: a task blocked in ray.get hands its CPUs back to Ray, which
    then starts another cell on the same cores (seen: both CPU cells at once on a 2-CPU node)."""
    return ref.future().result(timeout=timeout_s)


@dataclass
class TaskOutcome:
    """What a cell's Ray task tells the driver: skipped (the run stopped first), an error that stops the
    run, or the node that ran it and the cell's files (none when the node wrote into the shared run)."""

    skipped: bool = False
    error: str | None = None
    files: dict[str, bytes] = field(default_factory=dict)
    node: str | None = None


def _cell_task(plan: CellPlan, run_path: str, manifest_digest: str | None, inputs: list, timeout_s: float | None,
               signals, unset_env: list[str]) -> TaskOutcome:
    """Runs on a Ray worker: one cell, in the run directory when this node sees it, else in a scratch
    copy whose cell files go back to the driver."""
    import ray

    if _value(signals.stopped.remote()):
        return TaskOutcome(skipped=True)
    model = plan.engine.get("model")
    if model and os.path.isabs(model) and not os.path.exists(model):
        return TaskOutcome(error=f"the model {model} is not on Ray node {ray.util.get_node_ip_address()}: put it on "
                                 "a filesystem every node mounts at the same path, or give a model id the nodes can "
                                 "download")
    shared = manifest_digest is not None and _digest(RunDir(run_path).manifest_path) == manifest_digest
    scratch = None if shared else Path(tempfile.mkdtemp(prefix="kveval-ray-cell-"))
    run_dir = RunDir(run_path if shared else scratch)
    if scratch is not None:
        unpack_files(_value(inputs[0]), scratch)
    stop, finished = threading.Event(), threading.Event()

    def watch_stop() -> None:
        while not finished.wait(1.0):
            if _value(signals.stopped.remote()):
                stop.set()
                return

    watcher = threading.Thread(target=watch_stop, daemon=True)
    watcher.start()
    try:
        run_cell_process(run_dir, plan, timeout_s=timeout_s, stop=stop, env=dict.fromkeys(unset_env),
                         on_event=lambda event: signals.event.remote(plan.id, event))
        return TaskOutcome(files={} if shared else cell_files(run_dir, plan.id), node=ray.util.get_node_ip_address())
    finally:
        finished.set()
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)


class RayCells:
    """A connection to a Ray cluster that runs cells; `launch` blocks until its cell is done (call it
    from one thread per cell: Ray queues cells until a node has their devices). `slots`: how many
    cells may be in flight at once (names to hand out in plan order), None for no limit here."""

    def __init__(self, address: str | None, run_dir: RunDir, devices_per_cell: int, timeout_s: float | None,
                 note: Callable[[str], None] = print, *, copy_files: bool | None = None):
        self._ray = ray = _import_ray()
        forwarded = {k: v for k, v in os.environ.items() if k.startswith(_FORWARDED_ENV_PREFIXES)}
        check_reachable(address)
        handlers = _signal_handlers()
        try:
            ray.init(address=address, include_dashboard=False, log_to_driver=False, logging_level="WARNING",
                     runtime_env={"env_vars": forwarded} if forwarded else None)
        except (ConnectionError, RuntimeError, ValueError) as error:
            raise KvevalError(f"--executor ray: cannot connect to the Ray cluster at "
                              f"{address or 'a new local instance'}: {error}") from None
        finally:
            # Ray's core installs its own SIGTERM handler, which aborts the process: kveval's (stop every
            # cell, record them as interrupted, exit 130) must stay.
            _restore_signal_handlers(handlers)
        self._run_dir, self._timeout_s = run_dir, timeout_s
        # KVEVAL_RAY_COPY_FILES=1: send files both ways even where a node sees the run directory
        # (how the copy path is checked on one machine).
        self._copy_files = os.environ.get("KVEVAL_RAY_COPY_FILES") == "1" if copy_files is None else copy_files
        nodes = [n for n in ray.nodes() if n.get("Alive")]
        most_gpus = max((n["Resources"].get("GPU", 0) for n in nodes), default=0)
        if most_gpus and devices_per_cell > most_gpus:
            self.close()
            raise KvevalError(f"a cell needs {devices_per_cell} GPUs (tensor/pipeline parallel) and no Ray node "
                              f"has more than {most_gpus:g}")
        self._gpus = devices_per_cell if most_gpus else 0  # a CPU-only cluster runs CPU cells
        # A CPU cell's engine binds its threads to the node's cores: two on one node slowed generation
        # from 11 s to 147 s on 2 cores. So on CPUs a cell asks for every core of the smallest node.
        cpu_counts = [n["Resources"].get("CPU", 0) for n in nodes if n["Resources"].get("CPU", 0) >= 1]
        self._cpus = 1 if most_gpus else (min(cpu_counts) if cpu_counts else 1)
        # ...and at most one per CPU node in flight (slots), spread over the nodes: Ray alone may still
        # start a second one where a task waits on an object.
        self.slots = None if most_gpus else [f"ray-cpu-node-{i}" for i in range(max(1, len(cpu_counts)))]
        resources = ray.cluster_resources()
        self.gpus_in_cluster = int(resources.get("GPU", 0))
        self._signals = ray.remote(_Signals).options(num_cpus=0).remote()
        self._task = ray.remote(_cell_task)
        note(f"Ray: {len(nodes)} node(s), {resources.get('CPU', 0):g} CPUs, {resources.get('GPU', 0):g} GPUs; "
             + (f"{self._gpus} GPU(s) per cell" if self._gpus else
                f"CPU cells, {self._cpus:g} CPUs each (one per node at a time: vLLM's CPU engine uses every core)"))

    def launch(self, plan: CellPlan, on_event: Callable[[CellEvent], None], stop: threading.Event | None) -> schema.CellResult | None:
        """Run one cell on the cluster; its files are in the driver's run directory on return.
        None: the run was stopped before this cell began (nothing recorded, as in a local run)."""
        ray, run_dir = self._ray, self._run_dir
        inputs = ray.put(run_input_files(run_dir))
        began = time.monotonic()
        ref = self._task.options(num_gpus=self._gpus, num_cpus=self._cpus,
                                 scheduling_strategy="DEFAULT" if self._gpus else "SPREAD").remote(
            plan, str(run_dir.path.resolve()), None if self._copy_files else _digest(run_dir.manifest_path), [inputs],
            self._timeout_s, self._signals,
            # Ray sets OMP_NUM_THREADS to the task's CPUs when the driver has none; vLLM's CPU backend then
            # runs another thread set-up than a local cell (greedy tokens differed at token 60 of 64).
            [] if "OMP_NUM_THREADS" in os.environ else ["OMP_NUM_THREADS"])
        stop_sent = False
        while True:
            ready, _ = ray.wait([ref], timeout=0.5)
            for event in ray.get(self._signals.drain.remote(plan.id)):
                on_event(event)
            if stop is not None and stop.is_set() and not stop_sent:
                self._signals.stop.remote()
                stop_sent = True
            if ready:
                break
        try:
            outcome = ray.get(ref)
        except ray.exceptions.RayError as error:
            return self._lost(plan, error, time.monotonic() - began)
        if outcome.skipped:
            return None
        if outcome.error:
            raise KvevalError(f"{plan.id}: {outcome.error}")
        unpack_files(outcome.files, run_dir.path)
        # The node's address joins what the cell's own process recorded of its end.
        record = run_dir.load_cell(plan.id, validate=False) or {}
        process = {**(record.get("process") or {}), "node": outcome.node}
        return stored_cell(run_dir, plan.id, {**record, "process": process})

    def _lost(self, plan: CellPlan, error: BaseException, seconds: float) -> schema.CellResult:
        message = f"the Ray task running this cell failed: {type(error).__name__}: {str(error).splitlines()[0][:300]}"
        return stored_cell(self._run_dir, plan.id,
                           lost_task_record(self._run_dir.load_cell(plan.id, validate=False), plan, message, seconds))

    def close(self) -> None:
        self._ray.shutdown()


class _Ended(BaseModel):
    """How far a cell's own record got before its Ray task was lost."""

    model_config = ConfigDict(extra="ignore")
    started: Optional[bool] = None
    complete: bool = False
    process: Optional[dict] = None


def lost_task_record(stored: dict | None, plan: CellPlan, message: str, seconds: float) -> dict:
    """The record of a cell whose Ray task died (its node went away, its worker crashed): the cell's own
    record when it had written its end, a crash keeping its finished phases when it had started, else
    a start-up failure that a resume redoes (executor_lost)."""
    ended = _Ended.model_validate(stored) if isinstance(stored, dict) else _Ended()
    if stored is not None and ended.complete and ended.process:
        return stored  # its end (interrupted, timed out) was recorded before the task went
    if stored is not None and ended.started:
        record = {**stored, "crash": {"message": message, "cause": "executor_lost", "last_log_line": "",
                                      "advice": "re-run the same command into the same --out to redo this cell"}}
    else:
        record = not_started_record(plan.id, plan.kv.text, plan.max_model_len,
                                    StartupFailure("executor_lost", message, None, None), "")
    return {**record, "complete": True, "process": {"exit_code": None, "seconds": seconds, "cause": "executor_lost"}}
