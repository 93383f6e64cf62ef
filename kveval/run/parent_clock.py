"""The parent's own time between cells, by step (issue 18): how long its looks at the evidence (re-reading
and judging every cell file to decide what runs next) and the rounds' new task data and probes took, so
the review and `make bench` say where "between cells" went instead of one lump.

Steps are named by the caller; each keeps its total seconds and how often it ran. Not thread-safe: the
parent plans between cells on one thread.
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Iterator

LOOK = "looks"              # stored_run_verdict to plan remedies, rounds or the search's next candidate
ROUND_DATA = "round_data"   # a round's new task data and probes (tokenising; rounds.py)
CELL_FILES = "cell_files"   # per cell, the parent's time around its process: spec, hand-over, reading its file


class ParentClock:
    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.counts: dict[str, int] = {}

    @contextmanager
    def step(self, name: str) -> Iterator[None]:
        began = time.monotonic()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.monotonic() - began
            self.counts[name] = self.counts.get(name, 0) + 1

    def add(self, name: str, seconds: float) -> None:
        self.seconds[name] = self.seconds.get(name, 0.0) + max(0.0, seconds)
        self.counts[name] = self.counts.get(name, 0) + 1

    def record(self) -> dict[str, dict]:
        """The manifest's timing.steps: {step: {"seconds", "count"}}."""
        return {name: {"seconds": round(seconds, 3), "count": self.counts[name]} for name, seconds in self.seconds.items()}
