"""What the checks of the verdict share: the collector of checks and reasons, and short figures for
sentences."""
from __future__ import annotations

from kveval.gate.verdict import Check, Level, Reason


def _g(x: float | None) -> str:
    """Short figure for sentences: 0.0034, 0.41, 4.3."""
    return "n/a" if x is None else f"{x:.2g}" if abs(x) < 1 else f"{x:.3g}"


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f} %"


class _Collector:
    """Accumulates checks and reasons; statuses follow from the reasons' levels."""

    def __init__(self) -> None:
        self.checks: list[Check] = []
        self.reasons: list[Reason] = []

    def check(self, name: str, cell: str | None, value: float | None, limit: float | None, passed: bool | None,
              detail: str = "") -> None:
        self.checks.append(Check(name, cell, value, limit, passed, detail))

    def reason(self, level: Level, cell: str | None, message: str, decide: str = "", *, code: str) -> None:
        self.reasons.append(Reason(level, cell, " ".join(message.split()), " ".join(decide.split()), code))

    def levels(self, cell: str | None) -> set[str]:
        return {r.level for r in self.reasons if r.cell == cell}
