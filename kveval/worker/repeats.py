"""When to stop repeating a speed measurement (issue 41): after the minimum number of repeats, go on until
the median's interval is tight (analysis/repeat_interval: relative half-width at most the target, at 95 %)
or the phase's time for repeats is spent, or the most repeats are taken.

The phase's time is shared over its items (concurrency levels, workloads) in order: item i of L may repeat
until `budget × (i + 1) / L` seconds after the phase began, so a quick item leaves its time to the next
ones and a slow first item cannot starve the rest. The `guaranteed` runs of every item are never skipped
(the measurement the review had before repeats: one run per throughput level, --speed-runs per workload);
only the repeats beyond them are bounded.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

from kveval.analysis.repeat_interval import median_interval


@dataclass
class RepeatPlan:
    guaranteed: int           # runs taken whatever the time
    minimum: int              # runs taken while time is left
    maximum: int              # never more
    target: float             # relative half-width of the median's interval that is tight enough
    budget_s: float           # seconds of the phase for repeats, shared over its items
    items: int                # how many items share it
    clock: Callable[[], float] = time.monotonic
    began: float = field(default=0.0)

    def __post_init__(self) -> None:
        self.began = self.clock()

    def deadline(self, index: int) -> float:
        """When item `index` (0-based) must stop repeating."""
        return self.began + self.budget_s * (index + 1) / max(1, self.items)

    def more(self, index: int, measured: Sequence[Sequence[float | None]]) -> bool:
        """Whether item `index` runs again, given its repeats so far: one list per figure that must be tight
        (e.g. TTFT and decode tok/s); every figure must be."""
        done = max((len(values) for values in measured), default=0)
        if done < max(1, self.guaranteed):
            return True
        if done >= self.maximum or self.clock() >= self.deadline(index):
            return False
        if done < self.minimum:
            return True
        return not all(median_interval(values).tight(self.target) for values in measured)
