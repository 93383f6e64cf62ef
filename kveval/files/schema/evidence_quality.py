"""results.json, the evidence's quality figures: cells and pools, divergence, degeneration and
the greedy output diff."""
from __future__ import annotations

from typing import Any, Literal, Optional

from kveval.files.schema.base import FileModel, Number
from kveval.files.schema.cell import ScoringDesign
from kveval.files.schema.verdict import NoiseFloor


class Platform(FileModel):
    profile: Literal["gpu", "cpu", "cpu-amx"]
    why: str
    # Issue 38: each backend and device of a started cell whose budget was never calibrated (analysis/
    # backend_family.py), e.g. "FLASHINFER on NVIDIA L40S (cuda, compute capability 8.9)"; absent when none.
    uncalibrated: Optional[list[str]] = None


class EvidenceCell(FileModel):
    kv_spec: str
    max_model_len: int
    started: bool
    missing: bool = False                 # only written (True) for a planned cell with no file
    failure_reason: Optional[str]
    kv_pool_tokens: Optional[int]
    attention_backend_flag: Optional[str] = None   # a backend chosen for the cell, not the default (issue 23)
    reference_for: Optional[str] = None   # a quality reference: the baseline cell it stands in for (no capacity)
    # vLLM's platform layer in the cell (issue 38; absent for cells from before): cuda, rocm, cpu, ...; the
    # device's name and compute capability; the attention backend; whether its budget was calibrated.
    platform: Optional[str] = None
    device: Optional[str] = None
    capability: Optional[str] = None
    backend: Optional[str] = None
    calibrated: Optional[bool] = None


class PoolRow(FileModel):
    """analysis.capacity.pool_by_length row; the headline reads the ratios."""

    max_model_len: int
    kv_spec: Optional[str]              # None: only the baseline ran at this length
    baseline_pool_tokens: Optional[Number]
    pool_tokens: Optional[Number]
    ratio: Optional[Number]
    fallback_ratio: Optional[Number]    # from a cell that did not start: vLLM's logged pool or estimate
    fallback_sources: str
    baseline_fallback_tokens: Optional[Number]
    fallback_tokens: Optional[Number]
    not_started: str                    # "cell (reason), ..." of the cells at this length that did not start


class DivergenceSummary(FileModel):
    """analysis.divergence.divergence_summary: figures are None when nothing was scored."""

    n: int
    kl_mean: Optional[Number]
    kl_p99: Optional[Number]
    top1_n: int
    top1_agreement: Optional[Number]
    # The review's and tables' other figures (always written; default None only so a summary built by
    # hand with the gate's figures alone still reads).
    kl_median: Optional[Number] = None
    kl_p90: Optional[Number] = None
    kl_max: Optional[Number] = None
    top1_agreement_se: Optional[Number] = None
    dp_mean: Optional[Number] = None
    abs_dp_mean: Optional[Number] = None
    abs_dp_p99: Optional[Number] = None
    abs_dp_max: Optional[Number] = None
    dp_rms: Optional[Number] = None


class LateSummary(DivergenceSummary):
    start: int


class DivergenceBucket(DivergenceSummary):
    """analysis.divergence.by_position_bucket row: the figures over positions [start, end)."""

    bucket: str                           # "start-(end-1)", or "start+" for the open last bucket
    start: int
    end: Optional[int]                    # None: open


class ClusterFigure(FileModel):
    """analysis.divergence.clustered_figures: a figure as a mean over scored sequences, with its
    cluster-robust standard error (None with fewer than 2 sequences)."""

    estimate: Number
    se: Optional[Number]
    clusters: int
    positions: int


class Comparison(FileModel):
    cell: str
    reference: str
    kind: Literal["kv", "noise_length", "noise_batch"]
    summary: DivergenceSummary
    buckets: list[DivergenceBucket]
    max_position: Optional[int]
    by_sequence_kind: dict[str, dict[str, Any]]
    per_sequence: list[dict[str, Any]]
    skipped: list[dict[str, Any]]
    same_length: Optional[bool] = None    # kv comparisons only
    late: Optional[LateSummary] = None    # kv comparisons only
    kv_spec: Optional[str] = None         # kv comparisons only: the cell's
    max_model_len: Optional[int] = None   # kv comparisons only: the cell's
    clustered: Optional[dict[str, ClusterFigure]] = None   # kv comparisons only; absent before 2026-12-05
    looks: Optional[list[int]] = None     # kv comparisons with rounds: sequences compared at each look
    design: Optional[ScoringDesign] = None   # kv comparisons under a design: its N_max and final look


class Unmatched(FileModel):
    cell: str
    reason: str


class Divergence(FileModel):
    baseline_kv: str
    comparisons: list[Comparison]
    unmatched: list[Unmatched]
    noise_floor: Optional[NoiseFloor]
    top_k: list[int]


class DegenerationCell(FileModel):
    kv_spec: str
    max_model_len: int
    outputs: int
    new_degenerate: int
    judged_outputs: Optional[int]         # None for baseline cells
    outputs_with_findings: int
    detectors: dict[str, int]
    token_limit_rate: Optional[Number]
    baseline_only_degenerate: Optional[int] = None   # the other discordant count (None: baseline cells)
    looks: Optional[list[int]] = None     # judged outputs after each round (only where rounds were planned)
    n_max: Optional[int] = None           # the design's most outputs per cell
    n_max_looks: Optional[list[int]] = None   # the N_max at each look, where a larger --budget extended it
    final: Optional[bool] = None          # the last look spends the alpha left


class Finding(FileModel):
    """analysis.degeneration.scan_cells row (FINDING_COLUMNS): one detector firing on one output."""

    cell: str
    kv_spec: Optional[str]
    max_model_len: Optional[Number]
    prompt: str
    workload: Optional[str]
    detector: str
    detail: Optional[str]
    excerpt: Optional[str]
    new_vs_baseline: Optional[bool]       # None: no baseline output for the prompt (not judged)
    baseline_cell: Optional[str]
    baseline_excerpt: Optional[str] = None   # the baseline's output beside it (issue 22); absent before
    late: Optional[bool] = None              # a loop after the answer (issue 22); absent before


class Degeneration(FileModel):
    detectors: list[str]
    informational: list[str]
    cells: dict[str, DegenerationCell]
    findings: list[Finding]


# Evidence rows below come from pandas tables (analysis.json_values.records): an int column with a gap
# turns float there, so figures are `Number`; a key only newer kveval writes defaults to None (absent).

class DiffExcerpt(FileModel):
    """analysis.diff.divergence_excerpt: the text around the first differing character."""

    char_offset: Optional[int]
    before: Optional[str]
    candidate: Optional[str]
    reference: Optional[str]


class DiffPair(FileModel):
    """analysis.diff.diff_pairs row (PAIR_COLUMNS): one prompt's output against its reference cell's."""

    workload: str
    prompt: str
    cell: str
    reference: str
    comparison: Literal["kv", "length"]
    identical: bool
    first_divergent_token: Optional[int]
    similarity: Optional[Number]
    length_ratio: Optional[Number]
    tokens: Optional[Number]
    reference_tokens: Optional[Number]
    excerpt: Optional[DiffExcerpt]
    prefix_only: Optional[bool] = None    # identical until one stopped early; absent before it was counted


class DiffSummary(FileModel):
    """analysis.diff.diff_summary row (SUMMARY_COLUMNS): per workload, cell and reference."""

    workload: str
    cell: str
    reference: str
    comparison: Literal["kv", "length"]
    identical: int
    compared: int
    exact_match_rate: Optional[Number]
    median_similarity: Optional[Number]
    median_length_ratio: Optional[Number]
    earliest_divergence: Optional[Number]
    prefix_only: Optional[int] = None     # absent before it was counted


class DiffExample(FileModel):
    """analysis.diff.first_diverging_examples row (EXAMPLE_COLUMNS): the first diverging pair per workload and cell."""

    workload: str
    cell: str
    reference: str
    comparison: Literal["kv", "length"]
    prompt: str
    first_divergent_token: Optional[int]
    similarity: Optional[Number]
    excerpt: Optional[DiffExcerpt]


class Diff(FileModel):
    pairs: list[DiffPair]
    summary: list[DiffSummary]
    examples: list[DiffExample]
