"""Phases: the measurements a cell makes, in order, on its one started engine.

A phase is a function `run(engine, cell) -> schema.<Name>Phase` (see `CellContext`): the typed record
stored under `phases.<name>` in the cell's result file (files/schema/cell.py). Adding a measurement means
writing one module here, its record there, and adding both below — the runner and the cell loop do not change.
"""
from __future__ import annotations

from typing import Callable

from kveval.files import schema
from kveval.worker.phases import generation, scoring, speed, tasks, throughput

PHASES: dict[str, Callable[..., schema.Phase]] = {
    "generation": generation.run,
    "scoring": scoring.run,
    "speed": speed.run,
    "tasks": tasks.run,
    "throughput": throughput.run,
}

# Each phase's record: a phase that raised before storing anything is stored as one with its error.
RECORDS: dict[str, type[schema.Phase]] = {
    "generation": schema.GenerationPhase,
    "scoring": schema.ScoringPhase,
    "speed": schema.SpeedPhase,
    "tasks": schema.TasksPhase,
    "throughput": schema.ThroughputPhase,
}
