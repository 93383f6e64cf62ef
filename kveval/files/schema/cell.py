"""cells/<cell>.json: `CellResult` and its parts (`CellModel`), one cell's phases as the worker wrote them."""
from __future__ import annotations

from typing import Any, ClassVar, Literal, Optional, Union

from pydantic import ConfigDict, ModelWrapValidatorHandler, model_validator

from kveval.files.schema.base import FileModel, Number, _missing


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
    # vLLM's platform layer (inputs/device_platform.py; issue 38): absent in cells from before. `platform` is
    # cuda, rocm, cpu, xpu, ... (before, vLLM's device_type, which says "cuda" on ROCm too).
    device_name: Optional[str] = None         # NVIDIA H100 80GB HBM3; on a CPU the CPU's model
    device_capability: Optional[str] = None   # compute capability, "9.0"; None on a CPU


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
    def _remember_key_order(cls, data: Any, handler: ModelWrapValidatorHandler[ScoredPosition]) -> ScoredPosition:
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
    def _complete_unless_error(self) -> Phase:
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
    def _shape_matches_started(self) -> CellResult:
        if self.started and "capacity" not in self.model_fields_set:
            raise _missing("capacity", "a started cell records its KV pool")
        if not self.started and "failure" not in self.model_fields_set:
            raise _missing("failure", "a cell that did not start says why")
        return self
