"""Long-context task accuracy: lm-eval tasks run on this cell's engine (see worker/lmeval_lm.py).

kveval's own tasks (tasks/*.yaml) read the data the parent generated for this max_model_len
(run_dir/taskdata/L<len>/); any other name is handed to lm-eval as is, for users who have that
task's data locally. kveval's own tasks run in one `simple_evaluate` call, so the engine gets all their
requests as one batch; built-ins (or kveval's tasks after that call failed) run one call per task, so a
task that fails (e.g. a built-in whose data would need a download) is recorded with lm-eval's words and
the others still run; the phase is stored after every call, so a crash keeps the finished ones.

Per sample the record joins what the engine did (prompt tokens, accepted or rejected, the answer)
with lm-eval's own per-sample metric. A rejected sample has no score: it is never truncated.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Optional

from pydantic import BaseModel, ConfigDict

from kveval.files import schema
from kveval.files.rundir import RunDir

PRIMARY_METRIC = "all_match"     # kveval tasks: every expected value appears in the answer
PARTIAL_METRIC = "partial_match"


class _Lenient(BaseModel):
    """lm-eval's data and the engine's request records, as kveval reads them: the fields named, any
    value as given (a built-in task's document says what it likes), other keys ignored."""

    model_config = ConfigDict(extra="ignore")


class _Doc(_Lenient):
    """The fields kveval reads of a sample's document (kveval's own tasks write them: inputs/task_data)."""

    id: Any = None
    outputs: Any = None
    length_fraction: Any = None
    depth: Any = None
    target_tokens: Any = None
    needle_depths: Any = None


class _LoggedSample(_Lenient):
    """One entry of lm-eval's per-sample log (`log_samples=True`): the document, the target, and one
    top-level value per metric named in `metrics` (kept in `values`, with partial_match)."""

    doc_id: Any = None
    doc: Optional[_Doc] = None
    target: Any = None
    metrics: Optional[list[Any]] = None
    values: dict[str, Any] = {}

    @classmethod
    def of(cls, entry: dict) -> "_LoggedSample":
        sample = cls.model_validate(entry)
        wanted = {str(name) for name in sample.metrics or []} | {PARTIAL_METRIC}
        sample.values = {name: value for name, value in entry.items() if name in wanted}
        return sample

    @property
    def expected(self) -> Any:
        """The document's `outputs` when it has that key (even null), else lm-eval's target."""
        return self.doc.outputs if self.doc is not None and "outputs" in self.doc.model_fields_set else self.target

    @property
    def sample_id(self) -> str:
        return str(self.doc.id if self.doc is not None and "id" in self.doc.model_fields_set else self.doc_id)

    def value(self, metric: str | None) -> Any:
        return self.values[metric] if metric in self.values else None


class _Request(_Lenient):
    """One request record of worker/lmeval_lm.EngineLM (what the engine did for one lm-eval request)."""

    task: Any
    doc_id: Any
    prompt_tokens: Optional[int] = None
    max_gen_toks: Optional[int] = None
    accepted: Optional[bool] = None      # None until the engine answered
    rejection: Optional[str] = None
    error: Optional[str] = None
    response: Optional[str] = None
    finish_reason: Optional[str] = None
    output_tokens: Optional[int] = None
    seconds: Optional[float] = None


class _EvalOutput(_Lenient):
    """What kveval reads of `simple_evaluate`'s result: the aggregates and the per-sample log."""

    results: Optional[dict[str, Any]] = None
    samples: Optional[dict[str, list[Any]]] = None


def _primary_metric(entry: _LoggedSample, max_model_len: int | None = None) -> str | None:
    """The metric that scores this sample: kveval's all_match; else, for lm-eval's RULER tasks (one
    metric per context length, -1 for the lengths a sample is not about), the one named after this
    cell's length; else the first that holds a number of 0 or more."""
    names = list(entry.metrics or [])
    if PRIMARY_METRIC in names:
        return PRIMARY_METRIC
    if max_model_len is not None and str(max_model_len) in names:
        return str(max_model_len)
    for name in names:
        value = _number(entry.value(name))
        if value is not None and value >= 0:
            return name
    return names[0] if names else None


def _number(value) -> float | None:
    if isinstance(value, bool):
        return float(value)
    return float(value) if isinstance(value, (int, float)) else None


def _renumber_requests(requests: list[dict], chosen: list[int]) -> None:
    """With `samples=` lm-eval (0.4.13, Task.doc_iterator) numbers the requests 0..k-1 by the position of
    their document among the chosen ones, and labels the sample-log entry at position p `chosen[p]`; so
    the request at position p becomes `chosen[p]` too. Without this, a round that used part of its
    documents joined samples with other samples' requests and left the highest ones without any."""
    for request in requests:
        position = request.get("doc_id")
        if isinstance(position, int) and 0 <= position < len(chosen):
            request["doc_id"] = chosen[position]


def sample_records(task_samples: dict[str, list[dict]], requests: list[dict],
                   max_model_len: int | None = None) -> list[schema.TaskSample]:
    """One record per (task, doc): the engine's requests for it joined with lm-eval's sample log."""
    by_doc: dict[tuple, list[_Request]] = {}
    for request in map(_Request.model_validate, requests):
        by_doc.setdefault((request.task, request.doc_id), []).append(request)
    out = []
    for task, entries in task_samples.items():
        for entry in map(_LoggedSample.of, entries):
            doc = entry.doc or _Doc()
            asked = by_doc.get((task, entry.doc_id), [])
            accepted = bool(asked) and all(r.accepted for r in asked)
            error = next((r.error for r in asked if r.error), None)
            metric = _primary_metric(entry, max_model_len)
            score = _number(entry.value(metric)) if accepted and metric else None
            partial = _number(entry.value(PARTIAL_METRIC)) if accepted else None
            expected = entry.expected
            out.append(schema.TaskSample(
                task=task, doc_id=entry.doc_id, sample_id=entry.sample_id,
                length_fraction=doc.length_fraction, depth=doc.depth,
                target_tokens=doc.target_tokens, needle_depths=doc.needle_depths,
                prompt_tokens=max((r.prompt_tokens for r in asked), default=None),
                max_gen_toks=max((r.max_gen_toks for r in asked), default=None),
                requests=len(asked),
                accepted=accepted,
                rejection=next((r.rejection for r in asked if r.rejection), None),
                error=error if asked else "lm-eval made no request for this sample",
                response="\n".join(r.response or "" for r in asked),
                expected=expected if isinstance(expected, list) else [str(expected)],
                metric=metric, score=score,
                correct=None if score is None else score >= 1.0 - 1e-9,
                partial=partial,
                finish_reason=next((r.finish_reason for r in asked), None),
                output_tokens=sum(r.output_tokens or 0 for r in asked) if accepted else None,
                seconds=sum(r.seconds or 0.0 for r in asked),
            ))
    return out


def _doc_count(data_dir: Path | None, task: str) -> int | None:
    path = data_dir / f"{task}.jsonl" if data_dir else None
    if path is None or not path.is_file():
        return None
    return sum(1 for line in path.read_text(encoding="utf-8").splitlines() if line.strip())


def _task_data_plan(run_dir: RunDir | None) -> schema.TaskData:
    """The manifest's `task_data`: which data directory serves which max_model_len (inputs/task_selection.py);
    an empty plan without a manifest."""
    if run_dir is None or not run_dir.manifest_path.is_file():
        return schema.TaskData(data_dirs={}, files={}, skipped={})
    return schema.load(schema.Manifest, run_dir.manifest_path).task_data


def preload() -> None:
    """Import lm-eval and kveval's adapter ahead (a warm cell process, worker/cell_main.py, waiting for its
    cell): ~2-5 s of every tasks phase otherwise (issue 18)."""
    from lm_eval import simple_evaluate  # noqa: F401
    from lm_eval.tasks import TaskManager  # noqa: F401
    from transformers import AutoTokenizer  # noqa: F401

    from kveval.worker.lmeval_lm import EngineLM  # noqa: F401


class _Progress:
    """Which task runs (None: all of kveval's tasks in one call) and how many of its requests were answered."""

    def __init__(self) -> None:
        self.task: str | None = None
        self.done = 0

    def start(self, task: str | None) -> None:
        self.task, self.done = task, 0


def run(engine, cell) -> schema.TasksPhase:
    import lm_eval
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager
    from transformers import AutoTokenizer

    from kveval.worker import efficiency
    from kveval.worker.lmeval_lm import EngineLM
    from kveval.inputs.task_selection import spread
    from kveval.inputs.resources import LM_EVAL_TASKS_DIR as TASKS_DIR
    from kveval.inputs.task_data import TASKS as KVEVAL_TASKS
    from kveval.inputs.workloads import with_chat_template_kwargs

    # lm-eval logs every request at INFO; the cell log is for vLLM's words.
    logging.getLogger("lm_eval").setLevel(logging.WARNING)
    options = cell.options.tasks
    tasks = list(options.tasks)
    plan = _task_data_plan(cell.run_dir)
    length = str(cell.max_model_len)
    # A later round of task samples (run/rounds.py) names its own data directory.
    relative = options.data_dir or plan.data_dirs.get(length)
    data_dir = cell.run_dir.task_data_path(relative) if relative and cell.run_dir else None
    limit = options.limit
    lm_eval_results: dict[str, Any] = {}
    task_errors: dict[str, str] = {}
    samples: list[schema.TaskSample] = []

    def phase(**measured: Any) -> schema.TasksPhase:
        """The phase's record as it stands (stored after every lm-eval call, returned at the end)."""
        return schema.TasksPhase(tasks=tasks, lm_eval_version=getattr(lm_eval, "__version__", None),
                                 data_dir=relative or "", limit=limit, lm_eval_results=lm_eval_results,
                                 task_errors=task_errors, samples=samples, **measured)

    if not tasks:
        return phase()

    # Rendered with the run's chat-template arguments, as the parent rendered the task data (--chat-template-kwargs).
    tokenizer = with_chat_template_kwargs(AutoTokenizer.from_pretrained(cell.model_path or engine.settings.model),
                                          options.chat_template_kwargs)
    totals = {task: _doc_count(data_dir, task) for task in tasks}
    progress = _Progress()

    def on_request(record: dict) -> None:
        progress.done += 1
        cell.emit(event="step", phase="tasks", done=progress.done, total=totals.get(progress.task) or "?",
                  item=progress.task)

    lm = EngineLM(engine, tokenizer, cell.max_model_len, on_request=on_request)
    # Built-in RULER tasks read their lengths and tokenizer from metadata; kveval's read data_dir.
    metadata = {"data_dir": str(data_dir) if data_dir else "", "max_seq_lengths": [cell.max_model_len],
                "tokenizer": cell.model_path, "pretrained": cell.model_path}
    # lm-eval's full task index takes ~15 s to build: only when a built-in task was asked for.
    builtins = any(task not in KVEVAL_TASKS for task in tasks)
    manager = TaskManager(include_path=str(TASKS_DIR), include_defaults=builtins, metadata=metadata)
    skipped = plan.skipped.get(length)
    runnable = []
    for task in tasks:
        if task in KVEVAL_TASKS and totals.get(task) is None:
            planned = plan.files.get(length, {}).get(task)
            why = skipped or "; ".join(planned.skipped.values() if planned else ())
            task_errors[task] = f"no task data for max_model_len {cell.max_model_len}: {why or 'not generated'}"
            continue
        runnable.append(task)

    def evaluate(names: list[str], samples: dict[str, list[int]] | None) -> _EvalOutput:
        selection = {"samples": samples} if samples else {"limit": limit}
        output = simple_evaluate(model=lm, tasks=names, task_manager=manager, log_samples=True, bootstrap_iters=0,
                                 num_fewshot=None, random_seed=engine.settings.seed, **selection)
        return _EvalOutput.model_validate(output or {})

    def keep(output: _EvalOutput, chosen: dict[str, list[int]]) -> None:
        for task, positions in chosen.items():   # --limit on kveval's tasks: see _renumber_requests
            _renumber_requests([r for r in lm.records if r.get("task") == task], positions)
        lm_eval_results.update(json.loads(json.dumps(output.results or {}, default=str)))
        samples.extend(sample_records(output.samples or {}, lm.records, cell.max_model_len))
        cell.keep_partial("tasks", phase())

    # kveval's own tasks (all with data) go to lm-eval in one call: lm-eval hands every task's requests to
    # the engine as one batch, and sets up once (issue 18). A failure there falls back to one call per
    # task, so one task's failure does not lose the others.
    if len(runnable) > 1 and all(task in KVEVAL_TASKS for task in runnable):
        chosen = {task: spread(totals[task], limit) or list(range(totals[task])) for task in runnable}
        progress.start(None)
        totals[None] = sum(len(positions) for positions in chosen.values())
        cell.emit(event="step", phase="tasks", done=0, total=totals[None], item="all tasks")
        try:
            output = evaluate(runnable, chosen)
        except Exception as error:  # noqa: BLE001 - retried task by task below, where each failure is its own
            logging.getLogger(__name__).warning("tasks in one lm-eval call failed (%s: %s); one call per task",
                                                type(error).__name__, error)
            lm.records, lm.accepted_generations = [], []
        else:
            keep(output, chosen)
            runnable = []
    for task in runnable:
        progress.start(task)
        lm.records = []
        cell.emit(event="step", phase="tasks", done=0, total=totals.get(task) or "?", item=task)
        # --limit on kveval's tasks keeps samples spread over sizes and depths, not the first few.
        chosen = spread(totals[task], limit) if totals.get(task) else None
        try:
            output = evaluate([task], {task: chosen} if chosen else None)
        except Exception as error:  # noqa: BLE001 - one task's failure must not lose the others
            task_errors[task] = f"{type(error).__name__}: {error}"
            cell.keep_partial("tasks", phase())
            continue
        keep(output, {task: chosen} if chosen else {})
    measured = efficiency.measure(engine, "generate", lm.accepted_generations, cell.options.efficiency_sample)
    return phase(efficiency=measured) if measured else phase()
