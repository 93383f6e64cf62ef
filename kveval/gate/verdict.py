"""The verdict records: exit codes, statuses, Check, Reason, Verdict and its exit code."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field


EXIT_PASS = 0
EXIT_FAIL = 1
EXIT_USAGE = 2
EXIT_INCONCLUSIVE = 3

PASS, FAIL, INCONCLUSIVE, NOTE = "PASS", "FAIL", "INCONCLUSIVE", "NOTE"


@dataclass
class Check:
    """One comparison of a figure with its limit; passed None = could not be made or undecided."""

    name: str
    cell: str | None
    value: float | None
    limit: float | None
    passed: bool | None
    detail: str = ""


@dataclass
class Reason:
    """A sentence explaining the verdict. level: FAIL, INCONCLUSIVE, or NOTE (does not decide).
    decide: for INCONCLUSIVE, what would settle it (an option, a sample count, a rough time)."""

    level: str
    cell: str | None
    message: str
    decide: str = ""

    def __str__(self) -> str:
        return self.message


@dataclass
class Verdict:
    status: str
    reasons: list[Reason] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)
    thresholds: dict = field(default_factory=dict)
    noise_floor: dict | None = None
    cells: dict[str, str] = field(default_factory=dict)   # tested cell -> PASS / FAIL / INCONCLUSIVE / NOT STARTED
    profile: dict = field(default_factory=dict)          # {"name", "why", "budget"}
    defects: list[dict] = field(default_factory=list)    # {"cell", "message"}: engine-path defects, not FP8 damage
    attributed: dict[str, list[str]] = field(default_factory=dict)  # plain FP8 cell -> the layers its harm is attributed to

    def to_dict(self) -> dict:
        return {"status": self.status, "exit_code": exit_code(self),
                "cells": dict(self.cells), "profile": dict(self.profile),
                "defects": [dict(d) for d in self.defects], "attributed": dict(self.attributed),
                "reasons": [dataclasses.asdict(r) for r in self.reasons],
                "checks": [dataclasses.asdict(c) for c in self.checks],
                "thresholds": dict(self.thresholds), "noise_floor": self.noise_floor}


NOT_STARTED = "NOT STARTED"


def exit_code(verdict: Verdict) -> int:
    return {PASS: EXIT_PASS, FAIL: EXIT_FAIL, INCONCLUSIVE: EXIT_INCONCLUSIVE}[verdict.status]
