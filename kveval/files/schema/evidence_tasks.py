"""results.json, the evidence's task figures (`TaskEvidence`): per cell, per task, per sample row."""
from __future__ import annotations

from typing import Any, Optional, Union

from kveval.files.schema.base import FileModel, Number
from kveval.files.schema.cell import _Open
from kveval.files.schema.evidence_quality import Unmatched


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
