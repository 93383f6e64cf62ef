"""Running planned cells, parent side: one process per cell (or a Ray task), one after another or at once
on several devices, reusing what an identical earlier run finished; a rejected --engine-arg is a usage error."""
from __future__ import annotations

import re
import time

from kveval.defaults import BASELINE_KV
from kveval.errors import KvevalError
from kveval.files import schema
from kveval.files.rundir import RunDir, StoreError
from kveval.run.cell_process import CellPlan, run_cell_process
from kveval.run.death import log_tail
from kveval.run.devices import devices_per_cell
from kveval.run.fork_server import ForkServer
from kveval.run.options import CompareOptions
from kveval.run.parallel import run_in_parallel
from kveval.run.parent_clock import CELL_FILES, ParentClock
from kveval.run.preflight import CellWork, estimate_line
from kveval.run.ray_executor import RayCells
from kveval.run.resume import redo_reason
from kveval.run.starter import cells_env
from kveval.run.warm_process import WarmProcess


def run_plans(run_dir: RunDir, plans: list[CellPlan], reuse: bool, options: CompareOptions, show,
              devices: list[str] | None = None, ray: RayCells | None = None, warm: WarmProcess | ForkServer | None = None,
              clock: ParentClock | None = None, base_env: dict[str, str] | None = None,
              works: dict[str, CellWork] | None = None) -> None:
    """Every plan, reusing what an identical earlier run finished. With several devices, cells run at
    once, one per device (their engines see only theirs); on Ray, as many at once as the cluster has
    room for. The scoring reference runs first, alone, because every other cell scores its outputs.
    `warm`: cells one after another take the process started ahead there (not cells at once).
    `clock`: cells one after another add the parent's time around each process (CELL_FILES) there.
    `works`: the preflight's work per cell; cells one after another print a time estimate after the first."""
    def run_one(plan: CellPlan, env: dict | None = None, stop=None,
                warm: WarmProcess | ForkServer | None = None) -> schema.CellResult | None:
        try:
            previous = run_dir.cell_result(plan.id) if reuse else None
        except StoreError as error:  # a damaged result is measured again, not trusted
            show.note(f"{plan.id}: re-running it; its stored result is unusable ({error})")
            previous = None
        redo = redo_reason(previous, retry_failed=options.retry_failed,
                           budget_given=options.kv_cache_memory is not None) if previous is not None else None
        if previous is not None and redo is None:
            show.cell_reused(plan.id, previous)
            return None
        if redo:
            show.note(f"{plan.id}: running it again: {redo}")
        show.cell_started(plan.id, f"GPU {env['CUDA_VISIBLE_DEVICES']}" if env and env.get("CUDA_VISIBLE_DEVICES")
                          else "Ray task" if ray else None)
        on_event = lambda event, cell=plan.id: show.cell_event(cell, event)  # noqa: E731
        if ray is not None:
            facts = ray.launch(plan, on_event, stop)
            if facts is None:  # stopped before it began: nothing to record, as for a cell never reached
                return None
        else:
            facts = run_cell_process(run_dir, plan, timeout_s=options.cell_timeout, env=env, stop=stop,
                                     on_event=on_event, stall_s=options.stall_timeout, warm=warm)
        show.cell_finished(plan.id, facts)
        rejected = rejected_engine_arg(facts, options.engine_args, _log_tail(run_dir, plan.id))
        if rejected:
            # Every other cell would fail the same way: a usage error, not a finding.
            raise KvevalError(f"vLLM rejected --engine-arg {rejected}: {facts.failure.message} "
                              f"(recorded in {run_dir.cell_path(plan.id)})")
        return facts

    reference = next((p for p in plans if p.kv.text == BASELINE_KV), None) if "scoring" in options.phases else None
    first = reference.id if reference else None
    if ray is not None:
        # Ray queues cells until a node has room; CPU cells go one per node, in plan order.
        run_in_parallel(plans, ray.slots, 1, run_one, first=first, visible=False)
    elif not devices or len(devices) <= devices_per_cell(options.engine_args):
        env = cells_env(devices, base_env)
        estimated = not works
        for index, plan in enumerate(plans):
            began = time.monotonic()
            facts = run_one(plan, env, warm=warm)
            if clock is not None and facts is not None and facts.process is not None:
                clock.add(CELL_FILES, time.monotonic() - began - float(facts.process.seconds or 0.0))
            if not estimated and facts is not None and facts.started and plan.id in works:
                estimated = True   # once, from the first cell that measured its pace
                line = estimate_line(works[plan.id], facts, [works[p.id] for p in plans[index + 1:] if p.id in works])
                if line:
                    show.note(line)
    else:
        run_in_parallel(plans, devices, devices_per_cell(options.engine_args), run_one, first=first)


def _log_tail(run_dir: RunDir, cell: str) -> str:
    """The end of a cell's log, where vLLM names a rejected argument (run/death.py's one tail reader)."""
    try:
        return log_tail(run_dir.cell_log_path(cell).read_text(encoding="utf-8", errors="replace"), 80, 2000)
    except OSError:
        return ""


def rejected_engine_arg(facts: schema.CellResult, engine_args: dict, log_tail: str = "") -> str | None:
    """KEY=VALUE of the user's engine argument that vLLM refused when this cell started, if any: the
    start-up error is a validation error, and it (or the log lines after it) names the argument."""
    failure = facts.failure
    if facts.started or failure is None or failure.reason != "other" or not engine_args:
        return None
    message = failure.message
    if log_tail and "validation error" in message:
        message += "\n" + log_tail[log_tail.find("validation error"):]
    if not re.search(r"validation error|TypeError|ValueError|invalid|unexpected keyword", message, re.I):
        return None
    for key, value in engine_args.items():
        if re.search(rf"\b{re.escape(str(key).replace('-', '_'))}\b", message):
            return f"{key}={value}"
    return None
