"""The verdict records: exit codes, statuses, Check, Reason, Verdict and its exit code."""
from __future__ import annotations

import dataclasses
import numbers
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from kveval.files import schema
from kveval.gate.thresholds import Thresholds


EXIT_PASS = 0
EXIT_FAIL = 1
EXIT_USAGE = 2
EXIT_INCONCLUSIVE = 3
EXIT_FOUND = 4   # the asked configuration FAILs or is undecided, but a configuration kveval tested passes (gate/decision.py)

# `kveval gate --require`: what counts as deployable. plain: the configurations given with --kv, at every
# tested length; any: any tested FP8 configuration, up to its --max-model-len cap (EXIT_FOUND becomes 0).
REQUIRE = ("plain", "any")

# Final: each name is its literal type, so a status or level set from them checks against schema.Status.
PASS: Final = "PASS"
FAIL: Final = "FAIL"
INCONCLUSIVE: Final = "INCONCLUSIVE"
NOTE: Final = "NOTE"
Level = Literal["FAIL", "INCONCLUSIVE", "NOTE"]


@dataclass
class Check:
    """One comparison of a figure with its limit; passed None = could not be made or undecided."""

    name: str
    cell: str | None
    value: float | None
    limit: float | None
    passed: bool | None
    detail: str = ""

    def record(self) -> schema.Check:
        return schema.Check(name=self.name, cell=self.cell, value=_plain_number(self.value),
                            limit=_plain_number(self.limit), passed=self.passed, detail=self.detail)


@dataclass
class Reason:
    """A sentence explaining the verdict. level: FAIL, INCONCLUSIVE, or NOTE (does not decide).
    decide: for INCONCLUSIVE, what would settle it (an option, a sample count, a rough time).
    code: a stable name of the finding for machines (REASON_CODES), the message being for people."""

    level: Level
    cell: str | None
    message: str
    decide: str = ""
    code: str = ""

    def __str__(self) -> str:
        return self.message

    def record(self) -> schema.Reason:
        return schema.Reason(level=self.level, cell=self.cell, message=self.message, decide=self.decide,
                             code=self.code)


@dataclass
class Verdict:
    status: schema.Status
    reasons: list[Reason] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)
    thresholds: Thresholds = field(default_factory=Thresholds)
    noise_floor: schema.NoiseFloor | None = None
    cells: dict[str, schema.CellStatus] = field(default_factory=dict)   # tested cell -> PASS / FAIL / ... / NOT STARTED
    profile: schema.Profile | None = None         # the platform profile whose budget judged divergence
    defects: list[schema.Defect] = field(default_factory=list)   # engine-path defects, not FP8 damage
    attributed: dict[str, list[str]] = field(default_factory=dict)  # plain FP8 cell -> the layers its harm is attributed to

    def record(self, code: int | None = None) -> schema.VerdictRecord:
        """results.json's verdict. `code`: the run's exit code (Decision.exit_code) where known; else the status's.
        Only a verdict from `evaluate` (with its profile) has one."""
        if self.profile is None:
            raise ValueError("a verdict without a platform profile (not made by gate.evaluate) has no record")
        # Keyword order is the file's key order (FileModel keeps it).
        return schema.VerdictRecord(
            status=self.status, exit_code=exit_code(self) if code is None else code, cells=dict(self.cells),
            profile=self.profile, defects=list(self.defects), attributed=dict(self.attributed),
            reasons=[r.record() for r in self.reasons], checks=[c.record() for c in self.checks],
            thresholds=schema.Thresholds(**dataclasses.asdict(self.thresholds)), noise_floor=self.noise_floor)

    def to_dict(self, code: int | None = None) -> dict[str, Any]:
        """The record as written: `--json` output and results.json's verdict."""
        return schema.dump(self.record(code))


def _plain_number(value: object) -> float | None:
    """A figure as the file holds it: numpy's scalars (from the analysis) become Python's, NaN stays NaN
    (json_safe makes it null when the document is written)."""
    if value is None:
        return None
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    raise TypeError(f"a check's figure must be a number, got {value!r}")


NOT_STARTED: Final = "NOT STARTED"

# Every Reason.code the gate gives, for CI scripts that act on a finding (`kveval gate DIR --json`).
REASON_CODES = {
    "divergence_harm": "FAIL: divergence shown beyond a harm limit (lower bound over it)",
    "divergence_undecided": "divergence neither shown inside the healthy budget nor beyond the harm limit",
    "divergence_missing": "no teacher-forced divergence measured",
    "divergence_too_few_positions": "too few scored positions for a PASS",
    "divergence_too_few_late_positions": "too few scored positions in the late half of the context",
    "baseline_other_length": "NOTE: judged against the baseline at another length",
    "degeneration_excess": "FAIL: an excess of degenerate outputs shown above the harm bar",
    "degeneration_undecided": "degeneration neither shown harmful nor non-inferior",
    "degeneration_not_judged": "NOTE: no baseline outputs for the same prompts",
    "task_drop": "FAIL: task recovery shown under the harm bar",
    "task_undecided": "task accuracy neither shown non-inferior nor shown to drop",
    "task_not_judged": "no paired task samples",
    "task_recovery_undefined": "the baseline answered no task sample (a NOTE once its accuracy is shown under 10 %)",
    "task_phase_failed": "the tasks phase failed",
    "task_left_out": "NOTE: one task failed and is left out",
    "tasks_off": "NOTE: tasks were turned off",
    "harm_attributed": "FAIL: keeping the diagnosed layers removes the divergence",
    "engine_defect": "a defect of the engine path, not FP8 damage",
    "missing_result": "a planned cell has no result file",
    "not_started": "NOTE: the cell did not start (a start-up finding)",
    "nothing_to_judge": "no cell other than the baseline",
    "nothing_started": "no cell started, the baseline included",
    "no_tested_cell_started": "no tested cell started",
    "no_baseline": "no baseline cell started",
    "noise_floor_widens_budget": "NOTE: the baseline's noise floor widens the KL budget",
    "uncalibrated_backend": "NOTE: no budget was calibrated on this attention backend and device (issue 38)",
    "quality_reference": "NOTE: judged against a quality-only baseline",
    "imported_baseline": "NOTE: the baseline was imported from another run (--baseline-from)",
    "search_corrected": "NOTE: --search tests each candidate at alpha / its ladder's length",
}


def status_exit_code(status: schema.Status) -> int:
    """The code of a status alone (0 PASS, 1 FAIL, 3 INCONCLUSIVE); a run's code is gate/decision.py's."""
    return {PASS: EXIT_PASS, FAIL: EXIT_FAIL, INCONCLUSIVE: EXIT_INCONCLUSIVE}[status]


def exit_code(verdict: Verdict) -> int:
    """The code of the verdict's status over every tested cell, remedies included. A run exits with
    `Decision.exit_code` (gate/decision.py), which tells a remedy that passes (EXIT_FOUND) from none."""
    return status_exit_code(verdict.status)
