"""The review's "Where the time went" section (issue 18): per cell process its start-up, each phase, the
time inside engine calls and outside them, the engine's efficiency per phase, and the parent's own time.
Pure: evidence in, markdown out (analysis/timings.py made the rows).
"""
from __future__ import annotations

import pandas as pd

from kveval.files import schema
from kveval.render.markdown import MAX_OPEN_ROWS, fmt_float, long_table

__all__ = ["MAX_OPEN_ROWS", "timing_section"]   # past MAX_OPEN_ROWS processes the table folds (markdown.folded)


def _seconds(value) -> str:
    return fmt_float(value, 1)


def _phase_cell(timing: schema.PhaseTiming | None) -> str:
    if timing is None:
        return ""
    text = _seconds(timing.seconds) or "?"
    return text + (f" ({100 * timing.efficiency:.0f} %)" if timing.efficiency is not None else "")


def _process_cell(row: schema.TimingRow) -> str:
    return _seconds(row.process_seconds) + (" (forked)" if row.forked else " (warm)" if row.warm else "")


def _view(rows: list[schema.TimingRow], phases: list[str]) -> pd.DataFrame:
    view = {"process": [row.process for row in rows],
            "process s": [_process_cell(row) for row in rows],
            "start-up s": [_seconds(row.startup_seconds) for row in rows]}
    for name in phases:
        view[f"{name} s"] = [_phase_cell(next((p for p in row.phases if p.phase == name), None)) for row in rows]
    view["engine s"] = [_seconds(row.engine_seconds) + ("" if row.split_known else "*") for row in rows]
    view["outside engine s"] = [_seconds(row.outside_engine_seconds) for row in rows]
    return pd.DataFrame(view)


_STEP_WORDS = {"looks": "looks at the evidence", "round_data": "rounds' task data and probes",
               "cell_files": "around the cell processes (specs, hand-over, reading their files)"}


def _between_split(totals: schema.TimingTotals) -> str:
    """What the parent did between cells: its recorded steps and the rest; the run's words before they were recorded."""
    steps = totals.parent_steps
    if not steps:
        return "judging, planning remedies and rounds"
    parts = [f"{_STEP_WORDS.get(name, name)} {_seconds(step.seconds)} s"
             + (f" ({step.count}×)" if name == "looks" else "") for name, step in steps.items()]
    rest = totals.between_cells_seconds - sum(step.seconds for step in steps.values())
    return ", ".join(parts) + f", the rest {_seconds(max(0.0, rest))} s"


def _parent_line(totals: schema.TimingTotals) -> str:
    if totals.setup_seconds is None:
        return "- Parent, outside every cell: not recorded (runs before issue 18)."
    parts = [f"set-up {_seconds(totals.setup_seconds)} s (model, tokenising, planning, task data)"]
    if totals.diagnosis_seconds is not None:
        parts.append(f"K/V range pass {_seconds(totals.diagnosis_seconds)} s")
    if totals.between_cells_seconds is not None:
        parts.append(f"between cells {_seconds(totals.between_cells_seconds)} s ({_between_split(totals)})")
    run = (f"; the run took {_seconds(totals.run_seconds)} s up to its last cell" if totals.run_seconds is not None
           else "; the run had not finished its cells when this was written")
    return "- Parent, outside every cell: " + ", ".join(parts) + run + "."


def timing_section(evidence: schema.Evidence) -> str:
    rows, totals = evidence.timings, evidence.timing_totals
    if not rows or totals is None:
        return ""
    phases = [p.phase for p in totals.phases]
    out = ["## Where the time went", "",
           "Per cell process (each task round runs in a process of its own): its whole life, engine start-up, each "
           "phase's wall time, the time inside engine calls, and the rest (imports, kveval's own work between engine "
           "calls, files). In brackets: the phase's engine tokens/s against one batched call of a sample of its own "
           "requests on the same engine (100 % = as fast as that call); speed and throughput are controlled "
           "measurements and have none.", ""]
    out.append(long_table(_view(rows, phases), f"{len(rows)} processes", names=("process",)))
    if not all(row.split_known for row in rows):
        out += ["", "\\* a phase did not record its time inside engine calls (cells before issue 18): it counts "
                    "whole as engine time, so the split is unknown there."]
    if any(row.warm and not row.forked for row in rows):
        out += ["", "warm: the process was started while the previous cell ran, so its imports do not show in its time."]
    if any(row.forked for row in rows):
        out += ["", "forked: the process was forked from a server that imported Python's, torch's, vLLM's and "
                    "lm-eval's modules once for the run (still one process per cell), so no imports show in its time."]
    out += ["", f"- All {totals.processes} cell processes: {_seconds(totals.process_seconds)} s; start-up "
                f"{_seconds(totals.startup_seconds)} s, inside engine calls {_seconds(totals.engine_seconds)} s"
                + ("" if totals.split_known else " (some phases counted whole)")
                + f", outside them {_seconds(totals.outside_engine_seconds)} s.",
            _parent_line(totals)]
    return "\n".join(out)
