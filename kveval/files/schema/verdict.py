"""results.json, its verdict: the statuses, platform budget, thresholds, checks and reasons
(`VerdictRecord`, what gate.Verdict.record gives)."""
from __future__ import annotations

from typing import Literal, Optional

from kveval.files.schema.base import FileModel, Number


# --- results.json (render/outputs.results_document, evidence.build_evidence, gate.Verdict.record) ---

Status = Literal["PASS", "FAIL", "INCONCLUSIVE"]
CellStatus = Literal["PASS", "FAIL", "INCONCLUSIVE", "NOT STARTED", "MISSING"]
ProfileName = Literal["gpu", "cpu", "cpu-amx"]   # gate/thresholds.PROFILES


class Budget(FileModel):
    kl_mean_max: Number
    kl_late_max: Number
    top1_agreement_min: Number
    kl_mean_fail: Number
    kl_late_fail: Number
    kl_p99_max: Optional[Number] = None           # gated before the cluster intervals (2026-12-05), not since
    kl_p99_fail: Optional[Number] = None          # ditto
    top1_agreement_fail: Optional[Number] = None  # ditto


class Profile(FileModel):
    name: ProfileName
    why: str
    calibration: str
    budget: Budget


class Reason(FileModel):
    level: Literal["FAIL", "INCONCLUSIVE", "NOTE"]
    cell: Optional[str]       # None: about the whole run
    message: str
    decide: str               # for INCONCLUSIVE: what would settle it ("" otherwise)
    code: Optional[str] = None  # the finding's stable name (gate/verdict.REASON_CODES); absent before it existed


class Check(FileModel):
    name: str
    cell: Optional[str]
    value: Optional[Number]
    limit: Optional[Number]
    passed: Optional[bool]    # None: could not be made, or undecided
    detail: str


class Thresholds(FileModel):
    """gate.Thresholds.to_dict(): divergence limits left None come from the platform profile."""

    kl_mean_max: Optional[Number]
    kl_late_max: Optional[Number]
    top1_agreement_min: Optional[Number]
    kl_mean_fail: Optional[Number]
    kl_late_fail: Optional[Number]
    kl_p99_max: Optional[Number] = None           # retired 2026-12-05 (see Budget)
    kl_p99_fail: Optional[Number] = None
    top1_agreement_fail: Optional[Number] = None
    noise_multiplier: Number
    min_scored_tokens: int
    min_late_tokens: int
    max_new_degenerate_share: Number
    new_degenerate_allowance: int
    task_noninferiority_margin: Number
    task_recovery_min: Number
    alpha: Number
    degeneration_noninferiority_margin: Optional[Number] = None   # absent in results from before it existed
    attribution_min_reduction: Optional[Number] = None
    defect_factor: Optional[Number] = None


class NoiseSource(FileModel):
    kind: str
    cell: str
    reference: str
    n: int


class NoiseFloor(FileModel):
    kl_mean: Optional[Number]
    kl_p99: Optional[Number]
    top1_disagreement: Optional[Number]
    source: list[NoiseSource]


class Defect(FileModel):
    """An engine-path defect: the cell's figures do not measure FP8 quality (gate/defects.py)."""

    cell: str
    message: str


class VerdictRecord(FileModel):
    status: Status
    exit_code: int
    cells: dict[str, CellStatus]
    profile: Profile
    reasons: list[Reason]
    checks: list[Check]
    thresholds: Thresholds
    noise_floor: Optional[NoiseFloor]
    defects: Optional[list[Defect]] = None                  # engine-path defects
    attributed: Optional[dict[str, list[str]]] = None       # plain FP8 cell -> the layers its harm is attributed to
