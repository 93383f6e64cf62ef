"""Where the time went: per cell process its start-up, each phase, the time inside engine calls and the
rest (issue 18), summed over the run with the parent's own time. Pure: typed cells in, typed rows out.

One row per process: a cell's own, then each of its task rounds (cells/<cell>.tasks-r<k>.json, a process
of its own; files/task_rounds.py). Outside engine = process seconds - start-up - engine seconds: imports,
kveval's own work between engine calls, writing files. A phase that did not record its engine time
(cells before issue 18) counts whole as engine time and the row says the split is unknown.
"""
from __future__ import annotations

from typing import Iterable

from kveval.defaults import PHASES
from kveval.files import schema
from kveval.files.schema import CellResult, PhaseTiming, TimingRow, TimingTotals
from kveval.files.task_rounds import round_cell_id, rounds_of


def _phase_timing(name: str, phase: schema.Phase, seconds: float | None) -> PhaseTiming:
    efficiency = phase.efficiency
    if efficiency is None:
        return PhaseTiming(phase=name, seconds=seconds, engine_seconds=phase.engine_seconds)
    return PhaseTiming(
        phase=name, seconds=seconds, engine_seconds=phase.engine_seconds, efficiency=efficiency.ratio,
        engine_tok_s=_rate(efficiency.tokens, efficiency.engine_seconds),
        reference_tok_s=_rate(efficiency.reference_tokens, efficiency.reference_seconds),
        reference_requests=efficiency.reference_requests, method=efficiency.method)


def _rate(tokens: int, seconds: float) -> float | None:
    return tokens / seconds if seconds else None


def _own_tasks_seconds(phase: schema.TasksPhase, rounds: dict[int, CellResult]) -> float | None:
    """The cell's own tasks time: the merged phase (files/task_rounds._merged_tasks) adds every merged
    round's tasks seconds to the first's, and those rounds have rows of their own."""
    seconds = phase.seconds
    for outcome in phase.rounds or []:
        record = rounds.get(outcome.round)
        extra = record.phases.tasks if record is not None else None
        if seconds is not None and extra is not None and extra.seconds:
            seconds -= extra.seconds
    return seconds


def process_row(facts: CellResult, cell: str, round_number: int | None = None,
                rounds: dict[int, CellResult] | None = None) -> TimingRow:
    """One process's row. `facts`: its own record, or for a cell with rounds the merged cell
    (RunDir.cell_result) with `rounds` its round records by number, so the rounds' tasks time is taken out."""
    phases = []
    for name in PHASES:
        phase = getattr(facts.phases, name)
        if phase is None:
            continue
        seconds = _own_tasks_seconds(phase, rounds or {}) if name == "tasks" else phase.seconds
        phases.append(_phase_timing(name, phase, seconds))
    engine = sum(p.engine_seconds if p.engine_seconds is not None else (p.seconds or 0.0) for p in phases)
    # The scoring phase's warm-up call ran outside its engine clock (worker/phases/scoring._warm_up): engine time.
    engine += float(getattr(facts.phases.scoring, "warmup_seconds", None) or 0.0)
    process = facts.process.seconds if facts.process is not None else None
    startup = facts.startup_seconds
    return TimingRow(
        process=cell if round_number is None else round_cell_id(cell, round_number), cell=cell, round=round_number,
        started=facts.started, warm=facts.process.warm if facts.process is not None else None,
        forked=facts.process.forked if facts.process is not None else None,
        process_seconds=process, startup_seconds=startup, phases=phases, engine_seconds=engine,
        outside_engine_seconds=None if process is None else process - (startup or 0.0) - engine,
        split_known=all(p.engine_seconds is not None for p in phases))


def timing_rows(manifest: schema.Manifest, cells: dict[str, CellResult],
                rounds: dict[str, CellResult] | None = None) -> list[TimingRow]:
    """Every cell process of the run: each cell (`cells`, rounds merged: RunDir.cell_results), then its
    task rounds found in `rounds` (round id -> its own record: RunDir.round_results)."""
    rounds = rounds or {}
    out = []
    for name, facts in cells.items():
        own = {number: rounds[round_cell_id(name, number)] for number in rounds_of(manifest, name)
               if round_cell_id(name, number) in rounds}
        out.append(process_row(facts, name, None, own))
        out += [process_row(record, name, number) for number, record in own.items()]
    return out


def _sum(values: Iterable[float | None]) -> float:
    return sum(v for v in values if v is not None)


def timing_totals(manifest: schema.Manifest, rows: list[TimingRow]) -> TimingTotals:
    """The processes summed, and the parent's own time from the manifest (None where not recorded).
    Between cells (judging, planning rounds and remedies) is the run's wall time less set-up, the
    diagnosis pass and every process; only where that sum is this run's: cells one at a time, none kept
    from an earlier run."""
    phases = []
    for name in PHASES:
        mine = [p for row in rows for p in row.phases if p.phase == name]
        if mine:
            known = [p.engine_seconds for p in mine]
            phases.append(PhaseTiming(phase=name, seconds=_sum(p.seconds for p in mine),
                                      engine_seconds=None if None in known else _sum(known)))
    process = _sum(row.process_seconds for row in rows)
    timing = manifest.timing
    between = None
    if timing is not None and timing.run_seconds is not None and not (timing.cells_overlap or timing.resumed):
        left = timing.run_seconds - timing.setup_seconds - (timing.diagnosis_seconds or 0.0) - process
        between = left if left >= 0 else None   # a warm process's overlap can exceed it: no figure then
    return TimingTotals(
        processes=len(rows), process_seconds=process, startup_seconds=_sum(row.startup_seconds for row in rows),
        phases=phases, engine_seconds=_sum(row.engine_seconds for row in rows),
        outside_engine_seconds=_sum(row.outside_engine_seconds for row in rows),
        split_known=all(row.split_known for row in rows),
        setup_seconds=timing.setup_seconds if timing else None,
        diagnosis_seconds=timing.diagnosis_seconds if timing else None,
        run_seconds=timing.run_seconds if timing else None, between_cells_seconds=between,
        parent_steps=timing.steps if timing is not None and between is not None else {})
