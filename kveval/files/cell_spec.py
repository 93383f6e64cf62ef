"""The parent -> cell message (`cells/<cell>.spec.json`) and the settings each phase runs with.

The parent (run/cell_process) writes a CellSpec; the cell process (worker/cell_main) reads it once and
hands its phases typed options. Every phase setting is decided by the parent, from the suite
(inputs/suites) and the user's options (run/settings.build_phase_options): no phase has a default of its
own, so a value lives in one place.
"""
from __future__ import annotations

from typing import Any, Optional

from pydantic import BaseModel, ConfigDict


class _Message(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ScoringOptions(_Message):
    top_k: int                    # logprobs kept per position (the KL's support)
    noise: bool                   # the baseline re-scores its sequences in another batch: the noise floor
    continuation_kinds: tuple[str, ...] = ("short", "context")   # generated outputs also scored, by kind
    documents_file: Optional[str] = None   # a round's own documents (run/rounds); None: the run's scoring.json


class SpeedOptions(_Message):
    runs: int
    warmup: int
    workloads: Optional[list[str]]     # the workloads timed (None: one per workload kind)
    max_tokens: Optional[int]          # cap on each timed generation (None: the prompt's own)
    # Repeats beyond `runs` until the medians' intervals are tight (worker/repeats.py, issue 41); the
    # defaults are a spec file's from before: `runs` runs, no more.
    repeat_max: int = 0                # most measured runs per workload (0: `runs`)
    repeat_target: float = 0.05        # relative half-width of the median's 95 % interval
    repeat_budget_s: float = 0.0       # seconds of the phase for repeats beyond the first run of each workload


class TasksOptions(_Message):
    tasks: list[str]
    limit: Optional[int]               # samples per task at most
    data_dir: Optional[str] = None     # a round's own task data (run/rounds); None: the first look's
    # --chat-template-kwargs: lm-eval's prompts render as the parent's task data did
    # (inputs/workloads.with_chat_template_kwargs)
    chat_template_kwargs: Optional[dict[str, Any]] = None


class ThroughputOptions(_Message):
    levels: list[int]                  # concurrent requests per step of the sweep
    prompt_share: float                # prompt length as a share of max_model_len
    max_tokens: int
    # Repeats per level (worker/repeats.py, issue 41); the defaults are a spec file's from before: one run.
    repeats: int = 1                   # runs per level while the phase's repeat time lasts
    repeat_max: int = 1                # most runs per level
    repeat_target: float = 0.05        # relative half-width of the median output tok/s's 95 % interval
    repeat_budget_s: float = 0.0       # seconds of the phase for repeats beyond the first run of each level


class PhaseOptions(_Message):
    scoring: ScoringOptions
    speed: SpeedOptions
    tasks: TasksOptions
    throughput: ThroughputOptions
    # Requests in each phase's efficiency reference (worker/efficiency.py). 0: not measured, as in
    # spec files written before issue 18.
    efficiency_sample: int = 0


class CellSpec(_Message):
    """What one cell process is told: its engine, its phases and where its files are."""

    cell_id: str
    run_dir: str
    engine: dict[str, Any]                 # worker/engine_settings.EngineSettings fields
    kv_spec: str                           # the KV spec text the cell is named for (fp8:keep=0)
    phases: list[str]
    phase_options: Optional[PhaseOptions]  # None only for a cell whose phases take no options
    workloads_path: str
    result_path: str
    events_path: str
    log_path: str


JOB_PREFIX = "job "   # a fork server's stdin line "job PATH": PATH holds a ForkedJob, not a CellSpec


class ForkedJob(_Message):
    """The parent -> fork server message for work other than a cell (run/fork_server.ForkServer.run_job): a
    module's `main(argv)` run in a forked process, its stdout and stderr in `log_path` (the K/V range pass,
    run/diagnosis.py, which then skips importing torch and transformers afresh)."""
    module: str
    argv: list[str]
    log_path: str
