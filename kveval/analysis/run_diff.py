"""Two runs of one model compared (`kveval diff RUN_A RUN_B`): what changed from A to B in verdict,
divergence, task accuracy, KV pool and speed, each change judged against the runs' own noise. Pure:
the two manifests (`schema.Manifest`) and stored results (`schema.Results`) in, typed pydantic objects out.

Cells are matched by cell id (the same KV spec at the same max_model_len, e.g. `fp8-8192`); the tested
cells of only one run are listed, not compared.

How a change is judged (B against A):

- Verdict: PASS < INCONCLUSIVE (also NOT STARTED and MISSING: no verdict reached) < FAIL. A cell whose
  verdict rises on that scale got worse (PASS -> INCONCLUSIVE/FAIL/NOT STARTED, INCONCLUSIVE -> FAIL).
- KL mean (nats, the cell against its `auto` baseline): the change is beyond noise only if |Δ| exceeds
  the larger of the two runs' noise floors, a run's floor being its measured `auto`-vs-`auto` KL mean
  (`evidence.divergence.noise_floor.kl_mean`), or DEFAULT_KL_NOISE (1e-3 nats) when the run measured
  none or measured exactly 0 (a deterministic engine; a zero floor would call any change real).
  Harmful: KL up.
- Top-1 agreement: beyond noise only if |Δ| exceeds both the larger noise-floor top-1 disagreement and
  z(0.975) x the combined binomial standard error sqrt(pA(1-pA)/nA + pB(1-pB)/nB). Harmful: down.
- KL and top-1 are compared on the same text: when the runs scored partly different sequences (another
  suite, length or phase), on the sequences both scored alike (same id, start and length), pooled from
  the per-sequence rows weighted by positions, as the cell's own figures are; with none in common, the
  change is shown, never called beyond noise.
- Task accuracy of the tested cell: the two runs are independent samples (different samples, often a
  different n), so no pairing is assumed: the difference B - A gets Newcombe's hybrid score interval
  (Newcombe 1998, Statistics in Medicine 17:873, method 10; statsmodels
  `confint_proportions_2indep(method="newcomb")`) at 95 %. Beyond noise: the interval excludes 0.
  Harmful: B lower. The baseline's accuracy is shown beside it (a drop of both is the samples or the
  engine, not FP8).
- KV pool and speed are reported, not judged for "got worse": a pool has no noise measure, and
  speed's change is marked beyond the run-to-run spread only when the ranges (min-max over the
  measured runs) of A and B do not overlap (the rule of analysis/speed.py).

B got worse than A when some matched cell's verdict got worse, or its KL mean, top-1 agreement or
task accuracy changed beyond noise in the harmful direction.

The recommendation (issue 41) is compared as each run's results.json states it: the deploy command
(`deployment.vllm_serve`: the line less the vLLM version it was verified on, which the runs table shows),
the configuration, its --max-model-len cap, the lengths it passes at, and the exit code (`decision`, else
the verdict's, for results written before it). A change is reported (`recommendation_changed`), not
judged worse: the runs may have tried other configurations (a remedy, --search), so no cell may match.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal, Mapping, Optional

from pydantic import BaseModel

from kveval.files import schema

DEFAULT_KL_NOISE = 1e-3      # nats: a run's KL noise when it measured none (or exactly 0)
CONFIDENCE = 0.95
Z = 1.959963984540054        # standard normal 97.5 % quantile (two-sided 95 %)
VERDICT_RANK = {"PASS": 0, "INCONCLUSIVE": 1, "NOT STARTED": 1, "MISSING": 1, "FAIL": 2}
TASK_METHOD = "Newcombe hybrid score interval for B - A (independent samples), 95 %"

RULE = ("A change is beyond noise only if it exceeds the larger of the two runs' noise: for KL mean the "
        f"auto-vs-auto noise-floor KL mean ({DEFAULT_KL_NOISE:g} nats for a run that measured none or 0); for "
        "top-1 agreement the larger noise-floor top-1 disagreement and 1.96 combined binomial standard errors (both "
        "on the sequences both runs scored alike, not judged when none); for "
        "task accuracy a 95 % Newcombe interval of B - A (independent samples) that excludes 0. B got worse when a "
        "matched cell's verdict rose (PASS < INCONCLUSIVE < FAIL) or a change beyond noise is harmful (KL up, "
        "top-1 or task accuracy down). KV pool and speed are shown, not judged.")


class Model(BaseModel):
    model_config = {"protected_namespaces": ()}


class RunSide(Model):
    """One run as the diff names it: where, what ran, on what, and its verdict and noise."""

    path: str
    model: Optional[str]
    kveval: Optional[str]
    vllm: Optional[str]
    torch: Optional[str]
    device: Optional[str]              # the first GPU's nvidia-smi line, else the CPU
    created: Optional[str]
    command: Optional[str]
    verdict: Optional[str]
    profile: Optional[str]             # the gate's platform profile (gpu, cpu)
    noise_kl_mean: Optional[float]     # measured auto-vs-auto noise floor; None when none
    noise_top1_disagreement: Optional[float]


class Setting(Model):
    """One property of the two runs side by side."""

    name: str
    a: Optional[str]
    b: Optional[str]
    changed: bool


class Change(Model):
    """One figure in A and B; `delta` is B - A; `threshold` what |delta| must exceed to be beyond noise."""

    a: Optional[float]
    b: Optional[float]
    delta: Optional[float]
    threshold: Optional[float] = None
    beyond_noise: Optional[bool] = None   # None: not both measured
    harmful: bool = False                 # beyond noise, in the direction that is worse for B


class DivergenceDiff(Model):
    """KL and top-1 of the cell against its baseline in A and B. `basis` says on what they are compared:
    "same sequences" (both runs scored the same sequences: the cells' own figures), "common sequences"
    (the sequences both scored alike, pooled from the per-sequence rows), "other text" (none in common:
    shown, not judged) or "unknown" (no per-sequence rows: the cells' own figures, judged)."""

    basis: Literal["same sequences", "common sequences", "other text", "unknown"]
    reference_a: Optional[str]
    reference_b: Optional[str]
    scored_a: Optional[int]               # scored positions, all of the cell's sequences
    scored_b: Optional[int]
    sequences_a: int                      # scored sequences
    sequences_b: int
    sequences_common: int                 # the same id, start and length in both
    kl_mean: Change                       # on the basis; judged
    top1_agreement: Change                # on the basis; judged
    kl_mean_all: Change                   # the cells' own figures (all their sequences); shown
    kl_p99: Change                        # the cells' own; shown, not judged
    kl_late: Change                       # ditto


class TaskDiff(Model):
    n_a: int
    n_b: int
    baseline_a: Optional[float]
    baseline_b: Optional[float]
    accuracy: Change                      # the tested cell's accuracy; delta = B - A
    ci_low: Optional[float]               # Newcombe interval of B - A
    ci_high: Optional[float]
    method: str = TASK_METHOD


class PoolDiff(Model):
    tokens_a: Optional[int]
    tokens_b: Optional[int]
    ratio: Optional[float]                # B / A
    vs_baseline_a: Optional[float]        # the cell's pool / the auto pool at its length (run A)
    vs_baseline_b: Optional[float]


class CellDiff(Model):
    cell: str
    kv_spec: Optional[str]
    max_model_len: Optional[int]
    verdict_a: Optional[str]
    verdict_b: Optional[str]
    verdict_change: Literal["same", "better", "worse", "unknown"]
    reasons_new: list[str]                # reason codes B gives the cell that A did not
    reasons_gone: list[str]
    divergence: Optional[DivergenceDiff]
    tasks: Optional[TaskDiff]
    pool: Optional[PoolDiff]
    worse: bool
    why_worse: list[str]


class OneSided(Model):
    cell: str
    verdict: Optional[str]


class SpeedDiff(Model):
    cell: str
    workload: str
    decode_tok_s: Change
    ttft_ms: Change
    decode_vs_spread: Literal["beyond", "within", "too few runs", "n/a"]
    ttft_vs_spread: Literal["beyond", "within", "too few runs", "n/a"]


class ThroughputDiff(Model):
    cell: str
    concurrency: int
    output_tok_s: Change
    requests_per_s: Change


class RunDiff(Model):
    a: RunSide
    b: RunSide
    settings: list[Setting]
    kl_noise_threshold: float
    cells: list[CellDiff]
    only_in_a: list[OneSided]
    only_in_b: list[OneSided]
    speed: list[SpeedDiff]
    throughput: list[ThroughputDiff]
    worse: bool
    worse_cells: list[str]
    recommendation: list[Setting] = []     # deploy command, configuration, cap, passes at, exit code: A and B
    recommendation_changed: bool = False
    rule: str = RULE
    notes: list[str] = []


# --- reading ------------------------------------------------------------------------------------

def _num(value: Any) -> float | None:
    if value is None or isinstance(value, bool):
        return None
    value = float(value)
    return None if math.isnan(value) or math.isinf(value) else value


def model_mismatch(manifest_a: schema.Manifest, manifest_b: schema.Manifest, path_a: str = "A",
                   path_b: str = "B") -> str | None:
    """One line when the two runs are of different models (their manifests' model names), else None."""
    name_a, name_b = manifest_a.model.name, manifest_b.model.name
    if name_a == name_b:
        return None
    return (f"{path_a} and {path_b} are runs of different models ({name_a!r} and {name_b!r}); "
            "kveval diff compares two runs of the same model")


def _floor(results: schema.Results) -> schema.NoiseFloor | None:
    floor = results.evidence.divergence.noise_floor
    if floor is None and results.verdict is not None:
        floor = results.verdict.noise_floor
    return floor


def _kl_noise(floor: schema.NoiseFloor | None) -> float:
    measured = _num(floor.kl_mean) if floor is not None else None
    return measured if measured else DEFAULT_KL_NOISE


def _device(hardware: schema.Hardware) -> str | None:
    gpus = hardware.gpus
    if gpus:
        return str(gpus[0]).split(",")[0].strip() + (f" x{len(gpus)}" if len(gpus) > 1 else "")
    return hardware.cpu or hardware.machine


def _side(path: str, manifest: schema.Manifest, results: schema.Results) -> RunSide:
    floor = _floor(results)
    verdict = results.verdict
    versions = manifest.versions
    return RunSide(
        path=path, model=manifest.model.name or results.model, kveval=versions.kveval, vllm=versions.vllm,
        torch=versions.torch, device=_device(manifest.hardware), created=manifest.created,
        command=manifest.command or results.command,
        verdict=verdict.status if verdict else None, profile=verdict.profile.name if verdict else None,
        noise_kl_mean=_num(floor.kl_mean) if floor else None,
        noise_top1_disagreement=_num(floor.top1_disagreement) if floor else None)


def _text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, (dict, list)):
        return ", ".join(f"{k}={v}" for k, v in value.items()) if isinstance(value, dict) else " ".join(map(str, value))
    return str(value)


def _sig(value: float | None) -> str | None:
    return None if value is None else f"{value:.3g}"


def _run_settings(manifest: schema.Manifest) -> dict[str, Any]:
    """What a run was asked to do, by the name the settings table gives it."""
    options = manifest.options
    return {"model path": manifest.model.path, "revision": options.engine_args.get("revision"),
            "max_model_len": options.max_model_len, "KV configurations": options.kv, "suite": options.suite,
            "KV budget (bytes)": options.kv_cache_memory_bytes,
            "gpu_memory_utilization": options.gpu_memory_utilization, "enforce_eager": options.enforce_eager,
            "engine args": options.engine_args, "phases": options.phases, "tasks": options.tasks,
            "chat template kwargs": options.chat_template_kwargs}


def _settings(a: RunSide, b: RunSide, manifest_a: schema.Manifest, manifest_b: schema.Manifest) -> list[Setting]:
    rows = [("model", a.model, b.model), ("verdict", a.verdict, b.verdict), ("vLLM", a.vllm, b.vllm),
            ("torch", a.torch, b.torch), ("device", a.device, b.device), ("kveval", a.kveval, b.kveval)]
    settings_a, settings_b = _run_settings(manifest_a), _run_settings(manifest_b)
    rows += [(name, _text(settings_a[name]), _text(settings_b[name])) for name in settings_a]
    rows += [("noise floor KL mean", _sig(a.noise_kl_mean), _sig(b.noise_kl_mean)), ("created", a.created, b.created)]
    return [Setting(name=name, a=_text(va), b=_text(vb), changed=va != vb) for name, va, vb in rows
            if va is not None or vb is not None]


def _exit_code(results: schema.Results) -> int | None:
    """The code the run exited with: its decision's; for results written before it, the verdict's."""
    if results.decision is not None:
        return results.decision.exit_code
    return results.verdict.exit_code if results.verdict is not None else None


def _recommendation(results_a: schema.Results, results_b: schema.Results) -> list[Setting]:
    """What each run says to deploy, and the code it exited with, side by side (stored answers, not re-judged)."""
    def answer(results: schema.Results) -> dict[str, str | None]:
        deployment = results.deployment
        return {"deploy command": deployment.vllm_serve if deployment else None,
                "configuration": (deployment.configuration or "none (keep auto)") if deployment else None,
                "max-model-len cap": _text(deployment.max_model_len) if deployment else None,
                "passes at": (_text(deployment.passes_at) or None) if deployment else None,
                "exit code": _text(_exit_code(results))}
    a, b = answer(results_a), answer(results_b)
    return [Setting(name=name, a=a[name], b=b[name], changed=a[name] != b[name]) for name in a
            if a[name] is not None or b[name] is not None]


# --- per cell -------------------------------------------------------------------------------------

def _tested_cells(results: schema.Results) -> dict[str, str | None]:
    """Tested cell id -> its verdict (the verdict's cells; else the non-baseline evidence cells)."""
    if results.verdict is not None:
        return dict(results.verdict.cells)
    base = results.evidence.baseline_kv
    return {name: None for name, cell in results.evidence.cells.items() if cell.kv_spec != base}


def _kv_comparison(results: schema.Results, cell: str) -> schema.Comparison | None:
    return next((c for c in results.evidence.divergence.comparisons if c.kind == "kv" and c.cell == cell), None)


def _change(a: Any, b: Any) -> Change:
    a, b = _num(a), _num(b)
    return Change(a=a, b=b, delta=None if a is None or b is None else b - a)


def _judged(change: Change, threshold: float, harmful_sign: int) -> Change:
    if change.delta is None:
        return change.model_copy(update={"threshold": threshold})
    beyond = abs(change.delta) > threshold
    return change.model_copy(update={"threshold": threshold, "beyond_noise": beyond,
                                     "harmful": beyond and change.delta * harmful_sign > 0})


@dataclass(frozen=True)
class _Sequence:
    """One per-sequence row of a comparison (the schema keeps those rows as open dicts: analysis/divergence.py
    writes divergence_summary's figures into them), read once here."""

    scored_from: Any
    n: Any
    kl_mean: Any
    top1_n: Any
    top1_agreement: Any

    @classmethod
    def of(cls, row: Mapping[str, Any]) -> "_Sequence":
        return cls(*(row.get(name) for name in ("scored_from", "n", "kl_mean", "top1_n", "top1_agreement")))

    @property
    def span(self) -> tuple[Any, Any]:
        """Where scoring started and how many positions: two runs scored a sequence alike when these agree."""
        return self.scored_from, self.n


def _sequences(comparison: schema.Comparison | None) -> dict[str, _Sequence]:
    """id -> the comparison's per-sequence row."""
    if comparison is None:
        return {}
    return {str(row["id"]): _Sequence.of(row) for row in comparison.per_sequence if row.get("id") is not None}


def _pooled(rows: list[_Sequence]) -> tuple[float | None, float | None, int]:
    """KL mean and top-1 agreement over sequences, weighted by their positions (as the cell's own
    summary pools them); and the top-1 positions."""
    n = sum(_num(r.n) or 0 for r in rows)
    top1_n = sum(_num(r.top1_n) or 0 for r in rows)
    kl = sum((_num(r.n) or 0) * (_num(r.kl_mean) or 0) for r in rows) / n if n else None
    top1 = (sum((_num(r.top1_n) or 0) * (_num(r.top1_agreement) or 0) for r in rows) / top1_n
            if top1_n else None)
    return kl, top1, int(top1_n)


def _divergence(comp_a: schema.Comparison | None, comp_b: schema.Comparison | None, kl_threshold: float,
                floor_a: schema.NoiseFloor | None, floor_b: schema.NoiseFloor | None) -> DivergenceDiff | None:
    if comp_a is None and comp_b is None:
        return None
    sa, sb = (comp_a.summary if comp_a else None), (comp_b.summary if comp_b else None)
    late_a, late_b = (comp_a.late if comp_a else None), (comp_b.late if comp_b else None)
    seq_a, seq_b = _sequences(comp_a), _sequences(comp_b)
    common = [key for key, row in seq_a.items() if key in seq_b and seq_b[key].span == row.span]
    kl_all = _change(sa and sa.kl_mean, sb and sb.kl_mean)
    kl, top1 = kl_all, _change(sa and sa.top1_agreement, sb and sb.top1_agreement)
    top1_n = (sa.top1_n if sa else 0, sb.top1_n if sb else 0)
    if not seq_a or not seq_b:
        basis = "unknown"
    elif len(common) == len(seq_a) == len(seq_b):
        basis = "same sequences"
    elif common:
        basis = "common sequences"
        kl_a, top1_a, n_a = _pooled([seq_a[key] for key in common])
        kl_b, top1_b, n_b = _pooled([seq_b[key] for key in common])
        kl, top1, top1_n = _change(kl_a, kl_b), _change(top1_a, top1_b), (n_a, n_b)
    else:
        basis = "other text"
    if basis == "other text":   # measured on other text: a change is not the engine's alone; shown, not judged
        kl = kl.model_copy(update={"threshold": kl_threshold})
    else:
        kl = _judged(kl, kl_threshold, +1)
        disagreement = max([_num(f.top1_disagreement) or 0.0 for f in (floor_a, floor_b) if f is not None] or [0.0])
        if top1.delta is not None and top1.a is not None and top1.b is not None:
            se = math.sqrt(sum(p * (1 - p) / n for p, n in zip((top1.a, top1.b), top1_n) if n))
            top1 = _judged(top1, max(disagreement, Z * se), -1)
    return DivergenceDiff(
        basis=basis, reference_a=comp_a.reference if comp_a else None, reference_b=comp_b.reference if comp_b else None,
        scored_a=sa.n if sa else None, scored_b=sb.n if sb else None, sequences_a=len(seq_a), sequences_b=len(seq_b),
        sequences_common=len(common), kl_mean=kl, top1_agreement=top1, kl_mean_all=kl_all,
        kl_p99=_change(sa and sa.kl_p99, sb and sb.kl_p99),
        kl_late=_change(late_a and late_a.kl_mean, late_b and late_b.kl_mean))


def _task_cell(results: schema.Results, cell: str) -> schema.TaskCell | None:
    tasks: object = results.evidence.tasks   # TaskEvidence, or {} where no cell ran tasks
    return tasks.cells.get(cell) if isinstance(tasks, schema.TaskEvidence) else None


def _correct(accuracy: float | None, n: int) -> int | None:
    """Correct answers behind a stored accuracy over n samples, kept within 0..n."""
    if accuracy is None or not n:
        return None
    return min(max(int(round(accuracy * n)), 0), n)


def newcombe_interval(correct_b: int, n_b: int, correct_a: int, n_a: int) -> tuple[float, float]:
    """Newcombe's hybrid score interval (method 10) for p_B - p_A of two independent proportions, 95 %;
    always within [-1, 1]."""
    from statsmodels.stats.proportion import confint_proportions_2indep  # statsmodels takes ~1 s to import

    low, high = confint_proportions_2indep(correct_b, n_b, correct_a, n_a, method="newcomb", compare="diff",
                                           alpha=1 - CONFIDENCE)
    return max(-1.0, float(low)), min(1.0, float(high))


def _tasks(cell_a: schema.TaskCell | None, cell_b: schema.TaskCell | None) -> TaskDiff | None:
    if cell_a is None and cell_b is None:
        return None
    n_a, n_b = (cell_a.n if cell_a else 0), (cell_b.n if cell_b else 0)
    accuracy = _change(cell_a and cell_a.cell_accuracy, cell_b and cell_b.cell_accuracy)
    low = high = None
    correct_a, correct_b = _correct(accuracy.a, n_a), _correct(accuracy.b, n_b)
    if correct_a is not None and correct_b is not None:
        low, high = newcombe_interval(correct_b, n_b, correct_a, n_a)
        beyond = low > 0 or high < 0
        accuracy = accuracy.model_copy(update={"beyond_noise": beyond, "harmful": beyond and high < 0})
    return TaskDiff(n_a=n_a, n_b=n_b, baseline_a=_num(cell_a and cell_a.baseline_accuracy),
                    baseline_b=_num(cell_b and cell_b.baseline_accuracy), accuracy=accuracy, ci_low=low, ci_high=high)


def _pool_ratio(results: schema.Results, cell: schema.EvidenceCell | None) -> float | None:
    if cell is None:
        return None
    row = next((p for p in results.evidence.pools
                if p.max_model_len == cell.max_model_len and p.kv_spec == cell.kv_spec), None)
    return _num(row.ratio) if row else None


def _pool(results_a: schema.Results, results_b: schema.Results, cell: str) -> PoolDiff | None:
    ea, eb = results_a.evidence.cells.get(cell), results_b.evidence.cells.get(cell)
    if ea is None and eb is None:
        return None
    ta, tb = (ea.kv_pool_tokens if ea else None), (eb.kv_pool_tokens if eb else None)
    return PoolDiff(tokens_a=ta, tokens_b=tb, ratio=tb / ta if ta and tb is not None else None,
                    vs_baseline_a=_pool_ratio(results_a, ea), vs_baseline_b=_pool_ratio(results_b, eb))


def _verdict_change(a: str | None, b: str | None) -> str:
    if a not in VERDICT_RANK or b not in VERDICT_RANK:
        return "unknown"
    step = VERDICT_RANK[b] - VERDICT_RANK[a]
    return "worse" if step > 0 else "better" if step < 0 else "same"


def _codes(results: schema.Results, cell: str) -> list[str]:
    if results.verdict is None:
        return []
    return list(dict.fromkeys(r.code for r in results.verdict.reasons if r.cell == cell and r.code))


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3g}"


def _cell_diff(cell: str, verdict_a: str | None, verdict_b: str | None, results_a: schema.Results,
               results_b: schema.Results, kl_threshold: float) -> CellDiff:
    evidence_cell = results_b.evidence.cells.get(cell) or results_a.evidence.cells.get(cell)
    divergence = _divergence(_kv_comparison(results_a, cell), _kv_comparison(results_b, cell), kl_threshold,
                             _floor(results_a), _floor(results_b))
    tasks = _tasks(_task_cell(results_a, cell), _task_cell(results_b, cell))
    change = _verdict_change(verdict_a, verdict_b)
    why = [f"verdict {verdict_a} -> {verdict_b}"] if change == "worse" else []
    if divergence is not None:
        kl, top1 = divergence.kl_mean, divergence.top1_agreement
        if kl.harmful:
            why.append(f"KL mean {_fmt(kl.a)} -> {_fmt(kl.b)} (up {_fmt(kl.delta)}, noise {_fmt(kl.threshold)})")
        if top1.harmful:
            why.append(f"top-1 agreement {_fmt(top1.a)} -> {_fmt(top1.b)} (down {_fmt(None if top1.delta is None else -top1.delta)}, "
                       f"noise {_fmt(top1.threshold)})")
    if tasks is not None and tasks.accuracy.harmful:
        why.append(f"task accuracy {_fmt(tasks.accuracy.a)} -> {_fmt(tasks.accuracy.b)} "
                   f"(95 % interval of B - A {_fmt(tasks.ci_low)} to {_fmt(tasks.ci_high)})")
    codes_a, codes_b = _codes(results_a, cell), _codes(results_b, cell)
    return CellDiff(
        cell=cell, kv_spec=evidence_cell.kv_spec if evidence_cell else None,
        max_model_len=evidence_cell.max_model_len if evidence_cell else None, verdict_a=verdict_a,
        verdict_b=verdict_b, verdict_change=change, reasons_new=[c for c in codes_b if c not in codes_a],
        reasons_gone=[c for c in codes_a if c not in codes_b], divergence=divergence, tasks=tasks,
        pool=_pool(results_a, results_b, cell), worse=bool(why), why_worse=why)


# --- speed ----------------------------------------------------------------------------------------

def _vs_spread(ranges: list[tuple[Any, Any]], runs: tuple[Any, Any]) -> str:
    """"beyond" when the min-max ranges of A and B do not overlap (analysis/speed.py's rule)."""
    ranges = [(_num(low), _num(high)) for low, high in ranges]
    if any(low is None or high is None for low, high in ranges):
        return "n/a"
    if any((_num(n) or 0) < 2 for n in runs):
        return "too few runs"
    (low_a, high_a), (low_b, high_b) = ranges
    return "beyond" if high_b < low_a or low_b > high_a else "within"


def _speed(results_a: schema.Results, results_b: schema.Results) -> list[SpeedDiff]:
    rows_b = {(r.cell, r.workload): r for r in results_b.evidence.speed}
    out = []
    for a in results_a.evidence.speed:
        b = rows_b.get((a.cell, a.workload))
        if b is None:
            continue
        runs = (a.runs, b.runs)
        out.append(SpeedDiff(
            cell=a.cell, workload=a.workload, decode_tok_s=_change(a.decode_tok_s, b.decode_tok_s),
            ttft_ms=_change(a.ttft_ms, b.ttft_ms),
            decode_vs_spread=_vs_spread([(a.decode_tok_s_min, a.decode_tok_s_max),
                                         (b.decode_tok_s_min, b.decode_tok_s_max)], runs),
            ttft_vs_spread=_vs_spread([(a.ttft_ms_min, a.ttft_ms_max), (b.ttft_ms_min, b.ttft_ms_max)], runs)))
    return out


def _throughput(results_a: schema.Results, results_b: schema.Results) -> list[ThroughputDiff]:
    def rows(results: schema.Results) -> dict[tuple[str, float], schema.ThroughputRow]:
        return {(r.cell, level): r for r in results.evidence.throughput or []
                if (level := _num(r.concurrency)) is not None}
    rows_a, rows_b = rows(results_a), rows(results_b)
    return [ThroughputDiff(cell=key[0], concurrency=int(key[1]),
                           output_tok_s=_change(row_a.output_tok_s, rows_b[key].output_tok_s),
                           requests_per_s=_change(row_a.requests_per_s, rows_b[key].requests_per_s))
            for key, row_a in rows_a.items() if key in rows_b]


# --- the diff -------------------------------------------------------------------------------------

def compare_runs(path_a: str, manifest_a: schema.Manifest, results_a: schema.Results,
                 path_b: str, manifest_b: schema.Manifest, results_b: schema.Results) -> RunDiff:
    """B against A (see the module doc for the rules). Refuses runs of different models (ValueError)."""
    mismatch = model_mismatch(manifest_a, manifest_b, path_a, path_b)
    if mismatch:
        raise ValueError(mismatch)
    side_a, side_b = _side(path_a, manifest_a, results_a), _side(path_b, manifest_b, results_b)
    kl_threshold = max(_kl_noise(_floor(results_a)), _kl_noise(_floor(results_b)))
    tested_a, tested_b = _tested_cells(results_a), _tested_cells(results_b)
    cells = [_cell_diff(cell, tested_a[cell], tested_b[cell], results_a, results_b, kl_threshold)
             for cell in tested_a if cell in tested_b]
    notes = []
    common = [c.cell for c in cells if c.divergence is not None and c.divergence.basis == "common sequences"]
    other = [c.cell for c in cells if c.divergence is not None and c.divergence.basis == "other text"]
    if common:
        notes.append(f"KL and top-1 of {', '.join(common)} are compared on the sequences both runs scored alike "
                     "(the runs scored partly different text: another suite, length or phase)")
    if other:
        notes.append(f"A and B scored no sequence in common for {', '.join(other)} (another suite or length): their "
                     "KL and top-1 are measured on different text, shown and not judged")
    differing_refs = [c.cell for c in cells if c.divergence and c.divergence.reference_a and c.divergence.reference_b
                      and c.divergence.reference_a != c.divergence.reference_b]
    if differing_refs:
        notes.append(f"compared against other reference cells in A and B: {', '.join(differing_refs)}")
    worse_cells = [c.cell for c in cells if c.worse]
    recommendation = _recommendation(results_a, results_b)
    return RunDiff(
        a=side_a, b=side_b, settings=_settings(side_a, side_b, manifest_a, manifest_b), kl_noise_threshold=kl_threshold,
        cells=cells, only_in_a=[OneSided(cell=c, verdict=v) for c, v in tested_a.items() if c not in tested_b],
        only_in_b=[OneSided(cell=c, verdict=v) for c, v in tested_b.items() if c not in tested_a],
        speed=_speed(results_a, results_b), throughput=_throughput(results_a, results_b),
        worse=bool(worse_cells), worse_cells=worse_cells, recommendation=recommendation,
        recommendation_changed=any(row.changed for row in recommendation), notes=notes)
