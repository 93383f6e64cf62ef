"""results.json, the rest of the evidence: the K/V range diagnosis, acceptance, sample outputs, start-up,
timing, speed, throughput, capacity and attribution rows, and `Evidence` itself."""
from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal, Optional, Union

from pydantic import Field

from kveval.files.schema.base import FileModel, Number, _either
from kveval.files.schema.evidence_quality import Degeneration, Diff, Divergence, EvidenceCell, Platform, PoolRow
from kveval.files.schema.evidence_tasks import TaskEvidence
from kveval.files.schema.manifest import CalibrationEntry, ImportedBaseline, KvScales, ParentStep, Remedy, SearchRecord


class DiagnosedModel(FileModel):
    """kv_ranges.json's `model` as the diagnosis keeps it ({} when the ranges did not say)."""

    path: Optional[str] = None
    model_type: Optional[str] = None
    num_layers: Optional[int] = None
    num_attention_heads: Optional[int] = None
    num_kv_heads: Optional[int] = None
    head_dim: Optional[int] = None
    dtype: Optional[str] = None
    layer_types: Optional[list[Any]] = None


class RangeRow(FileModel):
    """analysis.kv_range._row: one layer's K, V (or Q) against the FP8 limit at its scale."""

    layer: int
    attention_type: Optional[str]
    tensor: str                           # "k", "v" ("q" in `query`)
    count: int
    absmax: Optional[Number]
    p99_9: Optional[Number]
    p99_99: Optional[Number]
    scale: Number
    limit: Optional[Number]               # None: the dtype is not FP8
    ratio: Optional[Number]
    over: Optional[int]
    share_over: Optional[Number]
    share_exact: bool
    saturates: bool
    nonfinite: int


class OffendingRange(FileModel):
    """A layer and tensor that leaves the FP8 range, most over first."""

    layer: int
    tensor: str
    absmax: Optional[Number]
    p99_9: Optional[Number]
    limit: Optional[Number]
    ratio: Optional[Number]
    share_over: Optional[Number]
    share_exact: bool


class WorstRange(FileModel):
    layer: int
    tensor: str
    absmax: Optional[Number]
    limit: Optional[Number]
    ratio: Optional[Number]


class LargestRange(FileModel):
    """analysis.kv_range._largest: the layer nearest its limit (largest |x| without one)."""

    layer: int
    absmax: Optional[Number]
    limit: Optional[Number]
    ratio: Optional[Number]
    headroom: Optional[Number]            # limit / absmax


class LargestRanges(FileModel):
    k: Optional[LargestRange]
    v: Optional[LargestRange]


class QueryRanges(FileModel):
    """analysis.kv_range._query_summary: the query's range, which FlashAttention-3 quantises to FP8 too."""

    rows: list[RangeRow]
    largest: Optional[LargestRange]
    median_absmax: Number
    over_layers: list[int]


class Diagnosis(FileModel):
    """analysis.kv_range.diagnose: one FP8 dtype's per-layer K/V ranges against its limits."""

    kv_cache_dtype: str
    fp8_max: Optional[Number]
    calibrated: bool
    scale_note: str
    tokens: Optional[int]
    documents: Optional[int]
    model: DiagnosedModel
    rows: list[RangeRow]
    offending_layers: list[int]
    offending: list[OffendingRange]
    worst_ratio: Optional[Number]
    worst: Optional[WorstRange]
    largest: LargestRanges
    outlier_layers: Optional[list[int]] = None   # absent when the ranges themselves failed
    error: Optional[str] = None
    note: Optional[str] = None                   # the cache dtype is not FP8: no limit applies
    query: Optional[QueryRanges] = None          # where the query was measured too


class DiagnosisFailed(FileModel):
    """evidence.diagnosis_evidence when the K/V range pass failed: only the error."""

    error: str


_NoTasks = Annotated[dict[str, Any], Field(max_length=0)]
if TYPE_CHECKING:   # what a read value is; pydantic validates by the tagged unions below
    TasksOrNone = Union[TaskEvidence, dict[str, Any]]
    DiagnosisOrFailed = Union[Diagnosis, DiagnosisFailed]
else:
    TasksOrNone = _either(TaskEvidence, _NoTasks, "<empty>", lambda v: v == {})   # {}: no cell ran tasks
    DiagnosisOrFailed = _either(Diagnosis, DiagnosisFailed, "<failed>",
                                lambda v: isinstance(v, dict) and "kv_cache_dtype" not in v)


class Rejection(FileModel):
    """analysis.acceptance.rejections row: a refused or failed prompt with the engine's own message."""

    cell: str
    prompt: str
    kind: Literal["rejected", "error"]
    message: Optional[str]


class Acceptance(FileModel):
    matrix: list[dict[str, Any]]       # per prompt: prompt, prompt_tokens, then cell id -> accepted/rejected/...
    rejections: list[Rejection]        # per refused prompt: cell, prompt, kind, the engine's message


class SampleRow(FileModel):
    cell: str
    tokens: Optional[int]
    finish: Optional[str]
    text: str


class SampleOutputs(FileModel):
    prompt: str
    rows: list[SampleRow]


class SpeedSettings(FileModel):
    enforce_eager: Optional[bool]


class StartupRow(FileModel):
    """analysis.capacity.startup_table row: one cell's start-up, its KV pool, or why it did not start."""

    cell: str
    kv_spec: Optional[str]
    max_model_len: Optional[Number]
    started: bool
    startup_s: Optional[Number]
    kv_pool_tokens: Optional[Number]
    max_concurrency: Optional[Number]
    num_blocks: Optional[Number] = None        # absent before the block count was kept
    logged_pool_tokens: Optional[Number]       # sized by vLLM before a cell that did not start gave up
    reason: Optional[str]
    message: Optional[str]
    estimated_max_model_len: Optional[Number]
    attention_backend: Optional[str]
    crash: Optional[str]
    crash_advice: Optional[str] = None         # only where a crashed cell has advice
    crash_cause: Optional[str] = None          # only "stalled"
    max_num_seqs: Optional[Number] = None      # the engine's cap on requests at once, where recorded (issue 41)


class PhaseTiming(FileModel):
    """analysis.timings: one phase of one cell process: its wall time, the part inside engine calls, and
    the engine's efficiency against a batched reference call (schema.PhaseEfficiency)."""

    phase: str
    seconds: Optional[Number]             # None: the phase stopped before it recorded its time
    engine_seconds: Optional[Number]      # None: not recorded (cells before issue 18)
    efficiency: Optional[Number] = None   # engine tokens/s over the batched reference's; None: not measured
    engine_tok_s: Optional[Number] = None
    reference_tok_s: Optional[Number] = None
    reference_requests: Optional[int] = None
    method: Optional[str] = None


class TimingRow(FileModel):
    """analysis.timings.timing_rows row: one cell process (a cell, or one of its task rounds) and where
    its time went."""

    process: str                          # the cell, or <cell>.tasks-r<k> for its round k
    cell: str
    round: Optional[int]                  # None: the cell's own process
    started: bool
    warm: Optional[bool]                  # started while the previous cell ran: its imports do not show
    forked: Optional[bool] = None         # forked from the run's fork server: its imports were done once, by the server
    process_seconds: Optional[Number]     # the child's whole life as the parent saw it (None: not recorded)
    startup_seconds: Optional[Number]
    phases: list[PhaseTiming]
    engine_seconds: Number                # inside engine calls; a phase without the split counts whole
    outside_engine_seconds: Optional[Number]   # process - start-up - engine (None without process_seconds)
    split_known: bool                     # every phase recorded its engine time


class TimingTotals(FileModel):
    """analysis.timings.timing_totals: every cell process summed, and the parent's own time (manifest)."""

    processes: int
    process_seconds: Number
    startup_seconds: Number
    phases: list[PhaseTiming]             # per phase summed (no efficiency: engines differ)
    engine_seconds: Number
    outside_engine_seconds: Number
    split_known: bool
    setup_seconds: Optional[Number]       # None: the run did not record its own time (before issue 18)
    diagnosis_seconds: Optional[Number]
    run_seconds: Optional[Number]
    between_cells_seconds: Optional[Number]   # run - set-up - diagnosis - processes; None where not one run's sum
    parent_steps: dict[str, ParentStep] = {}  # part of between cells, by step (manifest timing.steps)


class SpeedRow(FileModel):
    """analysis.speed.speed_table row: one workload in one cell at concurrency 1, and its change vs the baseline."""

    workload: str
    cell: str
    kv_spec: Optional[str]
    max_model_len: Optional[Number]
    prompt_tokens: Optional[Number]
    max_tokens: Optional[Number]
    runs: Number
    ttft_ms: Optional[Number]
    ttft_ms_min: Optional[Number]
    ttft_ms_max: Optional[Number]
    decode_tok_s: Optional[Number]
    decode_tok_s_min: Optional[Number]
    decode_tok_s_max: Optional[Number]
    throughput_tok_s: Optional[Number]
    decoded_tokens: Optional[Number]
    rejected: Optional[str]
    ttft_delta_pct: Optional[Number]
    decode_delta_pct: Optional[Number]
    ttft_vs_noise: Optional[Literal["beyond", "within", "too few runs"]] = None   # absent before issue 10
    decode_vs_noise: Optional[Literal["beyond", "within", "too few runs"]] = None
    # Issue 41 (analysis/repeat_interval.py): the median's 95 % order-statistic interval, and the ratio to the
    # baseline (Hodges-Lehmann) with its interval and that interval's real coverage; absent before.
    ttft_ms_low: Optional[Number] = None
    ttft_ms_high: Optional[Number] = None
    ttft_ratio: Optional[Number] = None
    ttft_ratio_low: Optional[Number] = None
    ttft_ratio_high: Optional[Number] = None
    ttft_ratio_confidence: Optional[Number] = None
    decode_ratio: Optional[Number] = None
    decode_ratio_low: Optional[Number] = None
    decode_ratio_high: Optional[Number] = None
    decode_ratio_confidence: Optional[Number] = None


class ThroughputRow(FileModel):
    """analysis.throughput.throughput_table row: one cell at one concurrency level."""

    cell: str
    kv_spec: Optional[str]
    max_model_len: Optional[Number]
    concurrency: Optional[Number]
    requests: int
    prompt_tokens: Optional[Number]
    wall_s: Optional[Number]
    requests_per_s: Optional[Number]
    output_tok_s: Optional[Number]
    ttft_ms_p50: Optional[Number]
    ttft_ms_p90: Optional[Number]
    ttft_ms_p99: Optional[Number]
    itl_ms_p50: Optional[Number]
    itl_ms_p90: Optional[Number]
    itl_ms_p99: Optional[Number]
    preemptions: Optional[Number]
    error: Optional[str]
    output_tok_s_vs_baseline: Optional[Number]   # None for the baseline, or without a baseline run
    max_concurrency: Optional[Number]
    # Issue 41, absent before: the level's repeats (output tok/s of each, the row's figure their median, its
    # 95 % order-statistic interval), the ratio's interval (analysis/repeat_interval.ratio_interval) with its
    # real coverage, and the engine's max_num_seqs.
    repeats: Optional[int] = None
    output_tok_s_repeats: Optional[list[Number]] = None
    output_tok_s_low: Optional[Number] = None
    output_tok_s_high: Optional[Number] = None
    output_tok_s_confidence: Optional[Number] = None
    vs_baseline_low: Optional[Number] = None
    vs_baseline_high: Optional[Number] = None
    vs_baseline_confidence: Optional[Number] = None
    max_num_seqs: Optional[Number] = None


class CapacityRow(FileModel):
    """analysis.capacity_model.capacity_rows row: one cell's KV pool predicted from the layout, and measured."""

    cell: str
    kv_spec: str
    max_model_len: Number
    bytes_per_token: Optional[Number]
    block_size: Optional[Number]
    budget_bytes: Optional[Number]
    budget_source: Optional[str]
    predicted_tokens: Optional[Number]
    predicted_blocks: Optional[Number] = None    # absent before blocks were predicted
    measured_tokens: Optional[Number]
    measured_blocks: Optional[Number] = None
    deviation: Optional[Number]
    flag: Optional[str]
    predicted_max_model_len: Optional[Number]
    layout_model: Optional[Literal["plain", "hybrid", "state"]] = None   # absent before the hybrid model; "state":
    # layers with a per-request state (linear attention, Mamba) beside the K/V cache
    started: bool
    measured_ratio: Optional[Number] = None      # against the baseline row at the same length;
    predicted_ratio: Optional[Number] = None     # absent in evidence from before (pipeline adds them)


class AttributionBucket(FileModel):
    """analysis.attribution.pair_figures bucket: plain FP8 against its remedy in one position range."""

    bucket: str
    start: int
    n: int
    n_sequences: Optional[int] = None     # scored sequences in the range: the sign-flip test's units
    n_blocks: Optional[int] = None        # evidence from before the test by sequence (2026-12-05)
    plain_kl_mean: Optional[Number]
    remedy_kl_mean: Optional[Number]
    p_remedy_worse: Optional[Number]


class Attribution(FileModel):
    """analysis.attribution.remedy_attribution: plain FP8 against its remedy cell on the same positions."""

    plain: str
    remedy: str
    reference: str
    kept: list[str]
    max_model_len: Optional[int]
    n_positions: int
    n_sequences: Optional[int] = None     # scored sequences: the units of the sign-flip test
    min_p: Optional[Number] = None        # the smallest p that test can give with them (2^-n)
    n_blocks: Optional[int] = None        # evidence from before the test by sequence (2026-12-05)
    plain_kl_mean: Optional[Number]
    remedy_kl_mean: Optional[Number]
    reduction: Optional[Number]           # share of plain FP8's KL mean the kept layers remove
    p_plain_worse: Optional[Number]
    p_remedy_worse: Optional[Number]
    identical: bool
    buckets: list[AttributionBucket]


class IdenticalSpecs(FileModel):
    """analysis.attribution.identical_specs: two specs whose per-position KL is identical."""

    cells: list[str]                      # [first, second]
    max_model_len: Optional[int]
    n_positions: int
    kl_mean: Optional[Number]


class QualityReference(FileModel):
    """run/reference.py: an `auto` cell started for quality only, in place of the baseline `for`."""

    for_: str = Field(alias="for")        # the baseline cell it stands in for
    kv_cache_memory_bytes: Optional[int]
    why: str
    cpu_offload_gb: Optional[Number] = None   # --reference offload: weights moved to host memory (issue 39)


class Evidence(FileModel):
    schema_version: int
    baseline_kv: str
    platform: Platform
    tasks_planned: bool
    cells: dict[str, EvidenceCell]
    pools: list[PoolRow]
    divergence: Divergence
    degeneration: Degeneration
    diff: Diff
    startup: list[StartupRow]
    speed: list[SpeedRow]
    speed_settings: SpeedSettings
    capacity_model: Optional[list[CapacityRow]] = None  # predicted vs measured pool per cell (issue 10)
    throughput: Optional[list[ThroughputRow]] = None    # per cell and concurrency level (issue 10)
    timings: Optional[list[TimingRow]] = None           # per cell process: start-up, phases, engine (issue 18)
    timing_totals: Optional[TimingTotals] = None        # ditto, summed, with the parent's own time
    acceptance: Acceptance
    sample_outputs: Optional[SampleOutputs]
    tasks: TasksOrNone
    diagnosis: dict[str, DiagnosisOrFailed]       # FP8 dtype -> diagnosis; {} when none ran
    kv_scales: Optional[KvScales]
    remedy: Optional[Remedy]
    quality_references: Optional[dict[str, QualityReference]] = None  # reference cell -> what it stands in for
    attribution: Optional[list[Attribution]] = None        # absent in evidence from before remedies
    identical_specs: Optional[list[IdenticalSpecs]] = None  # ditto
    calibration: Optional[dict[str, CalibrationEntry]] = None   # the manifest's, when a scaled spec ran (issue 20)
    search: Optional[SearchRecord] = None                       # the manifest's, with --search (issue 20)
    imported_baseline: Optional[ImportedBaseline] = None        # the manifest's, with --baseline-from (issue 39)
