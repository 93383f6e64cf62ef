"""The Python API. The CLI is a thin shell over `compare`, `report`, `gate`, `load_run` and `generate_task_data`.

    import kveval
    result = kveval.compare(kv=["fp8", "auto"], max_model_len=[2048, 8192], kv_cache_memory="150MiB")
    print(result.verdict.status, result.review_path)
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from kveval import defaults
from kveval.errors import KvevalError, RunInterrupted
from kveval.files import schema
from kveval.files.rundir import DiskFull, RunDir, StoreError, cell_id, ensure_writable_dir, write_json_atomic
from kveval.files.run_lock import live_writer
from kveval.gate import EXIT_USAGE, GateConfigError, Thresholds, Verdict, exit_code, load_thresholds
from kveval.gate.decision import exit_code_for as _decision_exit_code
from kveval.gate.verdict import EXIT_FOUND, REQUIRE
from kveval.inputs.kvspec import ATTENTION_TYPES as KEEP_ATTENTION_TYPES
from kveval.inputs.model_config import ModelSource, load_tokenizer
from kveval.inputs.models import (ModelError, ModelInfo, default_model_info, kveval_home, prepare_default_model,
                                  resolve_model)
from kveval.inputs.resources import LM_EVAL_TASKS_DIR
from kveval.inputs.suites import SUITES, get_suite
from kveval.inputs.task_data import TASK_GROUP, TASKS as TASKS_BY_NAME, write_task_data
from kveval.inputs.task_selection import task_shape
from kveval.run import baseline_import
from kveval.run.option_model import (VLLM_SHORTCUTS, CommandLineOption, CompareOptions, checked,
                                     command_line_options)
from kveval.run.options import normalized, validate_options
from kveval.run.remedy import REMEDY_MODES

__all__ = ["CompareOptions", "EXIT_USAGE", "KEEP_ATTENTION_TYPES", "KvevalError", "REMEDY_MODES", "RunInterrupted", "RunResult", "SUITES",
           "TASK_GROUP", "TASKS_BY_NAME", "Thresholds", "compare", "compare_options", "default_model",
           "exit_code", "file_schema", "gate", "generate_task_data", "judge", "kveval_home", "lm_eval_tasks_dir", "load_run",
           "report", "resolve_thresholds", "run_in_progress", "EXIT_WORSE", "diff_runs", "diff_markdown",
           "EXIT_FOUND", "REQUIRE", "checked_require", "run_exit_code", "judge_decision", "baseline",
           "BASELINE_PHASES", "CommandLineOption", "command_line_options", "VLLM_SHORTCUTS"]


@dataclass
class RunResult:
    """A stored run, typed: its manifest (`schema.Manifest`) and its cells by id (`schema.CellResult`, later
    rounds merged in), with the review, verdict and evidence once `report` (or `compare`) judged it.
    `kveval.file_schema("cell")` and files/schema/ say what each field holds; `schema.dump(model)` gives a
    file's dict back."""

    run_dir: Path
    manifest: schema.Manifest
    cells: dict[str, schema.CellResult]
    review_path: Path | None = None
    verdict: Verdict | None = None
    evidence: schema.Evidence | None = None
    results_path: Path | None = None
    html_path: Path | None = None   # review.html: the review as one page to share
    decision: schema.Decision | None = None   # the two answers and the exit code (run_exit_code)

    def cell(self, kv_spec: str, max_model_len: int) -> schema.CellResult | None:
        return self.cells.get(cell_id(kv_spec, max_model_len))


def resolve_thresholds(thresholds: Thresholds | None = None, gate_config: str | Path | None = None,
                       gate_overrides: dict | None = None, stored: dict | None = None) -> Thresholds:
    """Thresholds given as such, else defaults < `stored` (a run's thresholds.json) < YAML file
    `gate_config` < `gate_overrides`."""
    if thresholds is not None:
        if gate_config is not None or gate_overrides:
            raise KvevalError("give either thresholds or gate_config/gate_overrides, not both")
        return thresholds
    try:
        return load_thresholds(gate_config, gate_overrides or {}, base=stored)
    except GateConfigError as error:
        raise KvevalError(str(error)) from None


def compare_options(model: str | None = None, kv: Sequence[str] = defaults.KV,
                    max_model_len: Sequence[int] | None = None, **kwargs) -> CompareOptions:
    """The checked settings `compare` runs with (a KvevalError for a bad one). `max_model_len` left
    out: the default lengths, without those over the model's limit."""
    lengths = defaults.MAX_MODEL_LEN if max_model_len is None else max_model_len
    options = normalized(checked(model=model, kv=tuple(kv), max_model_len=tuple(int(x) for x in lengths),
                                 lengths_given=max_model_len is not None, **kwargs))
    validate_options(options)
    return options


def compare(model: str | None = None, kv: Sequence[str] = defaults.KV,
            max_model_len: Sequence[int] | None = None, *, progress: Any = None, **kwargs) -> RunResult:
    """Run the (KV configuration x max_model_len) matrix, store every fact, write review.md.
    Keyword arguments: the fields of kveval.run.option_model.CompareOptions (see compare_options)."""
    from kveval.run.compare import run_matrix
    from kveval.run.setup import set_up_run
    from kveval.run.starter import end_starter
    from kveval.run.progress import ConsoleProgress

    options = compare_options(model, kv, max_model_len, **kwargs)
    # Before any engine starts: a bad thresholds file must not cost a run.
    thresholds = resolve_thresholds(None, options.gate_config, options.gate_overrides)
    show = progress if progress is not None else ConsoleProgress()
    for dropped, kept in options.merged_kv:
        show.note(f"--kv {dropped} is the same cache as {kept} in vLLM (FP8 e4m3 on every platform): run once, as {kept}")
    if options.baseline_added and options.baseline_from is None:   # with --baseline-from it is imported, not run
        show.note(f"--kv {' '.join(options.kv[:-1])}: no `auto` baseline given, so kveval added it "
                  f"(--kv {' '.join(options.kv)}): every verdict is judged against `auto` at the same length")
    setup = None
    try:
        setup = set_up_run(options, show)   # holds the run directory's lock from here on
        # Stored before any cell runs: a later `kveval report` / `gate` re-judges with the run's own limits.
        write_json_atomic(setup.run.thresholds_path, thresholds.to_dict())
        run_matrix(setup, thresholds, show)
        return report(setup.run.path, progress=show, thresholds=thresholds)
    except DiskFull as error:
        raise KvevalError(_disk_full_message(error, setup.run.path if setup else options.out)) from None
    finally:
        if setup is not None:
            end_starter(setup.starter)   # run_matrix ends it; this covers a failure before it began
            if setup.lock is not None:
                setup.lock.release()


BASELINE_PHASES = ("generation", "scoring", "tasks")   # what an imported baseline is compared on (issue 39)


def baseline(model: str | None = None, max_model_len: Sequence[int] | None = None, *,
             phases: Sequence[str] = BASELINE_PHASES, progress: Any = None, **kwargs) -> RunResult:
    """A portable baseline run (issue 39): the `auto` cells only, quality phases only, for a later
    `compare(..., baseline_from=run_dir)` where `auto` cannot start at these lengths. Made with the same
    model, seed, suite, prompts and tasks as that run (it refuses what differs); no remedy, rounds or
    diagnosis, which need FP8 cells. Keyword arguments: those of `compare` (CompareOptions)."""
    unknown = [p for p in phases if p not in BASELINE_PHASES]
    if unknown:
        raise KvevalError(f"a baseline run measures {', '.join(BASELINE_PHASES)} only; not {', '.join(unknown)}")
    for name in ("kv", "remedy", "search", "baseline_from"):
        if name in kwargs:
            raise KvevalError(f"a baseline run sets {name} itself (`auto` cells only)")
    settings = {"remedy": "off", "diagnose": False, "budget": "0", **kwargs}
    return compare(model, ("auto",), max_model_len, progress=progress, phases=tuple(phases), **settings)


def baseline_gaps(run_dir: str | Path) -> list[str]:
    """One line per `auto` cell of a baseline run that cannot serve as a baseline (it did not start, or lacks
    a quality phase: a crash, a timeout, a phase error); [] when the run is ready for --baseline-from."""
    return baseline_import.baseline_gaps(RunDir(run_dir))


def _disk_full_message(error: DiskFull, run_dir: str | Path | None) -> str:
    """One line: where the disk filled, what is safe, and how to go on."""
    finished = RunDir(run_dir).finished_cell_count() if run_dir else 0
    return (f"{error}; {finished} finished cell{'s' if finished != 1 else ''} "
            f"{'are' if finished != 1 else 'is'} safe; free space and run the same command to resume")


def run_in_progress(run_dir: str | Path) -> str | None:
    """"pid N: COMMAND" of another live `compare` still writing run_dir, else None (files/run_lock.py)."""
    return live_writer(Path(run_dir))


def load_run(run_dir: str | Path) -> RunResult:
    return _load_typed(run_dir)[0]


def _load_typed(run_dir: str | Path) -> tuple[RunResult, schema.Manifest, dict[str, schema.CellResult]]:
    """The stored run, its typed manifest (`RunDir.manifest`) and typed cells (`RunDir.cell_results`, what
    the evidence is built from and what RunResult hands out): each file is read once."""
    store = RunDir(run_dir)
    try:
        manifest = store.manifest()
        typed = store.cell_results(manifest)
    except StoreError as error:
        raise KvevalError(str(error)) from None
    result = RunResult(store.path, manifest, typed,
                       store.review_path if store.review_path.exists() else None,
                       html_path=store.review_html_path if store.review_html_path.exists() else None)
    return result, manifest, typed


def report(run_dir: str | Path, *, progress: Any = None, thresholds: Thresholds | None = None,
           gate_config: str | Path | None = None, gate_overrides: dict | None = None) -> RunResult:
    """Recompute the evidence and the verdict from the stored files alone (no engine); write
    results.json, tables/*.csv, review.md and review.html. Thresholds: `thresholds`, or defaults < the run's own
    (thresholds.json, written by `compare`) < the YAML file `gate_config` < `gate_overrides`."""
    from kveval.pipeline import write_review

    result, manifest, evidence, verdict = _judged(run_dir, thresholds, gate_config, gate_overrides)
    try:
        review = write_review(RunDir(run_dir), manifest, evidence, verdict)
    except StoreError as error:
        raise KvevalError(str(error)) from None
    result.results_path, result.review_path, result.html_path = review.results_path, review.review_path, review.html_path
    result.evidence, result.verdict = review.evidence, review.verdict
    result.decision = _decision(review.verdict, review.evidence, manifest)[1]
    if progress is not None:
        progress.note(f"Review written: {review.review_path} (HTML: {review.html_path})")
    return result


def _judged(run_dir: str | Path, thresholds: Thresholds | None, gate_config: str | Path | None,
            gate_overrides: dict | None) -> tuple[RunResult, schema.Manifest, schema.Evidence, Verdict]:
    """The stored run, its evidence and the verdict on it, with the thresholds `report` describes; nothing written."""
    from kveval.pipeline import stored_evidence_verdict, stored_run_verdict

    result, manifest, typed = _load_typed(run_dir)
    run = RunDir(run_dir)
    try:
        stored = run.load_thresholds() if thresholds is None else None
    except StoreError as error:
        raise KvevalError(str(error)) from None
    limits = resolve_thresholds(thresholds, gate_config, gate_overrides, stored)
    try:
        # A published report keeps manifest and results but not the bulky cells: re-judge its evidence.
        if not result.cells and not run.has_cell_files() and run.results_path.is_file():
            evidence, verdict = stored_evidence_verdict(run.results().evidence, limits)
        else:
            evidence, verdict = stored_run_verdict(run, manifest, typed, limits)
    except StoreError as error:
        raise KvevalError(str(error)) from None
    return result, manifest, evidence, verdict


def judge(run_dir: str | Path, thresholds: Thresholds | None = None, *, gate_config: str | Path | None = None,
          gate_overrides: dict | None = None) -> Verdict:
    """The verdict for a stored run (no engine), with nothing in the run directory written."""
    return _judged(run_dir, thresholds, gate_config, gate_overrides)[3]


def _decision(verdict: Verdict, evidence: schema.Evidence,
              manifest: schema.Manifest) -> tuple[schema.Deployment, schema.Decision]:
    from kveval.render.headline import decision_of, deployment_of

    deployment = deployment_of(verdict, evidence, manifest)
    return deployment, decision_of(verdict, evidence, manifest, deployment)


def judge_decision(run_dir: str | Path, thresholds: Thresholds | None = None, *,
                   gate_config: str | Path | None = None,
                   gate_overrides: dict | None = None) -> tuple[Verdict, schema.Deployment, schema.Decision]:
    """The verdict, the deploy answer and the decision (asked and deployable verdicts, exit code): the
    review's first screen, typed, for a stored run; nothing written."""
    _, manifest, evidence, verdict = _judged(run_dir, thresholds, gate_config, gate_overrides)
    return (verdict, *_decision(verdict, evidence, manifest))


def judge_deployment(run_dir: str | Path, thresholds: Thresholds | None = None, *,
                     gate_config: str | Path | None = None,
                     gate_overrides: dict | None = None) -> tuple[Verdict, schema.Deployment]:
    """The verdict and the deploy answer (the review's first screen, typed) for a stored run; nothing written."""
    verdict, deployment, _ = judge_decision(run_dir, thresholds, gate_config=gate_config, gate_overrides=gate_overrides)
    return verdict, deployment


def checked_require(require: str) -> str:
    """`kveval gate --require`'s word, checked (a KvevalError in one line for another)."""
    word = str(require).strip().lower()
    if word not in REQUIRE:
        raise KvevalError(f"--require {require!r}: give plain (the configurations given with --kv pass at every "
                          "tested length) or any (any tested FP8 configuration passes, up to its --max-model-len cap)")
    return word


def run_exit_code(decision: schema.Decision, require: str = "plain") -> int:
    """The code a run exits with: 0 deployable as asked, 1 nothing FP8 deployable, 3 undecided, EXIT_FOUND (4)
    what was asked does not pass but a configuration kveval tested does (0 with require="any")."""
    return _decision_exit_code(decision, checked_require(require))


EXIT_WORSE = 5   # `kveval diff`: run B got worse than run A (apart from 0-4, 70 and 130, the other commands' codes)


def diff_runs(run_a: str | Path, run_b: str | Path):
    """Run B against run A of the same model (a vLLM upgrade, another GPU, another revision): verdict,
    divergence, task accuracy, KV pool and speed per matched cell, judged against each run's noise
    (kveval.analysis.run_diff.RunDiff; `.worse` is what EXIT_WORSE reports). Reads manifest.json and
    results.json(.gz) only; a KvevalError (one line) for a missing or unusable run or two different models."""
    from kveval.analysis.run_diff import compare_runs, model_mismatch

    runs = [RunDir(run_a), RunDir(run_b)]
    try:
        manifests = [run.manifest() for run in runs]
    except StoreError as error:
        raise KvevalError(str(error)) from None
    mismatch = model_mismatch(*manifests, str(run_a), str(run_b))
    if mismatch:
        raise KvevalError(mismatch)
    results = []
    for run in runs:
        if not run.results_path.is_file():
            raise KvevalError(f"{run.path}: no results.json (run `kveval report {run.path}` first)")
        try:
            results.append(run.results())
        except StoreError as error:
            raise KvevalError(str(error)) from None
    return compare_runs(str(run_a), manifests[0], results[0], str(run_b), manifests[1], results[1])


def diff_markdown(diff) -> str:
    """`kveval diff`'s markdown report of a diff_runs result."""
    from kveval.render.run_diff_section import run_diff_markdown

    return run_diff_markdown(diff)


def gate(run_dir: str | Path, thresholds: Thresholds | None = None, *, gate_config: str | Path | None = None,
         gate_overrides: dict | None = None) -> Verdict:
    """The verdict for a stored run (no engine); results.json and review.md are rewritten with it."""
    return report(run_dir, thresholds=thresholds, gate_config=gate_config, gate_overrides=gate_overrides).verdict


def generate_task_data(out: str | Path, max_model_len: int, *, model: str | None = None,
                       tasks: Sequence[str] | None = None, task_lengths: Sequence[float] | None = None,
                       task_depths: Sequence[float] | None = None, task_samples: int | None = None,
                       suite: str = defaults.SUITE, seed: int = defaults.SEED, progress: Any = None) -> dict:
    """Write kveval's task data for one max_model_len into OUT/<task>.jsonl, for the stock lm_eval
    CLI (`lm_eval --include_path "$(kveval tasks path)" --tasks kveval_longctx --metadata '{"data_dir": "OUT"}'`)."""
    try:
        shape = task_shape(get_suite(suite), tasks, task_lengths, task_depths, task_samples)
    except ValueError as error:  # TaskSelectionError is one
        raise KvevalError(str(error)) from None
    others = [n for n in shape.names if n not in TASKS_BY_NAME]
    if others:
        raise KvevalError(f"only kveval's own tasks have generated data; not: {', '.join(others)}")
    if int(max_model_len) < 64:
        raise KvevalError(f"--max-model-len {max_model_len} is too small (at least 64)")
    try:
        ensure_writable_dir(Path(out), "--out")
    except StoreError as error:
        raise KvevalError(str(error)) from None
    try:
        model_info = resolve_model(model, progress=progress)
    except ModelError as error:
        raise KvevalError(str(error)) from None
    tokenizer = load_tokenizer(ModelSource(path=model_info.path))
    out = Path(out)
    try:
        return write_task_data(tokenizer, out, int(max_model_len), shape.names, fractions=shape.fractions,
                               depths=shape.depths, samples_per_point=shape.samples, seed=seed)
    except ValueError as error:
        raise KvevalError(f"cannot generate task data for max_model_len {max_model_len}: {error}") from None
    except OSError as error:
        raise KvevalError(f"--out {out}: cannot write the task data ({error.strerror or error})") from None


def default_model(prepare: bool = False, progress: Any = None) -> ModelInfo:
    """The embedded default model, converted first when `prepare` (and not yet converted)."""
    if prepare:
        try:
            prepare_default_model(progress=progress)
        except ModelError as error:
            raise KvevalError(str(error)) from None
    return default_model_info()


def file_schema(kind: str) -> dict:
    """The JSON Schema of a run file: results, manifest, cell or kv_ranges."""
    from kveval.files import schema

    return schema.json_schema(kind)


def lm_eval_tasks_dir() -> Path:
    """The directory of kveval's lm-eval task YAMLs (for lm_eval --include_path)."""
    return LM_EVAL_TASKS_DIR.resolve()
