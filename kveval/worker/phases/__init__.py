"""Phases: the measurements a cell makes, in order, on its one started engine.

A phase is a function `run(engine, cell) -> dict` (see `CellContext`); what it returns is stored
under `phases.<name>` in the cell's result file. Adding a measurement means writing one module
here and adding it to `PHASES` — the runner and the cell loop do not change.
"""
from __future__ import annotations

from typing import Callable

from kveval.worker.phases import generation, scoring, speed, tasks, throughput

PHASES: dict[str, Callable] = {
    "generation": generation.run,
    "scoring": scoring.run,
    "speed": speed.run,
    "tasks": tasks.run,
    "throughput": throughput.run,
}
