"""The verdict: may this model run with the tested KV-cache dtype? Pure; reads stored evidence only.

Primary evidence is teacher-forced KL against the baseline cache at the same max_model_len
(InferPilot's design), with budgets widened by the baseline's own noise floor:
budget = max(threshold, noise_multiplier × floor). Degeneration and task accuracy are secondary
checks, made when their evidence exists.

Task accuracy (evidence["tasks"]["cells"]: per non-baseline cell, pooled over tasks, on the samples
it and the baseline at the same max_model_len both scored): recovery = cell / baseline accuracy.
Recovery ≥ task_recovery_min passes; below it, McNemar's exact p < alpha fails the cell, and a drop
that is not significant makes the verdict INCONCLUSIVE (too few samples to tell). No check when the
recovery is undefined (no paired sample, or the baseline got none right).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path

from .analysis.cells import BASELINE_KV

EXIT_PASS = 0
EXIT_FAIL = 1
EXIT_USAGE = 2
EXIT_INCONCLUSIVE = 3

PASS, FAIL, INCONCLUSIVE, NOTE = "PASS", "FAIL", "INCONCLUSIVE", "NOTE"


class GateConfigError(ValueError):
    """A thresholds file or override that cannot be used (unknown key, wrong type, bad value)."""


@dataclass
class Thresholds:
    """Limits of the gate. Defaults are calibrated on measured figures (SmolLM2-135M):
    FACTS.md, one 1,499-token document: healthy fp8 vs auto KL mean 0.0034 / p99 0.037 / top-1
    96.9 % on H200, 0.0078 / 0.124 / 96.3 % on CPU; harmed (K×100, Q÷100) 0.41 / 4.3 / 80 %.
    kveval's own H200 runs (vLLM 0.26, FA3, 2,421 scored positions: a 2,048-token document plus
    reference continuations; reports/h200-planted): healthy 0.0115 / 0.082 / 92.2 %; harmed K×128
    0.595 / 4.38 / 47.9 %; V×128 on layers 0-9 and K×16 (values stay inside the e4m3 range, so not
    actually harmed) 0.0118 and 0.0121; batch-composition noise floor 0.0010 / 0.005 / 97.5 %.
    """

    kl_mean_max: float = 0.03
    """Mean per-position KL (nats) allowed before widening by the noise floor. The deciding
    statistic: it averages every position, so it is stable where a p99 over ~15 tail positions is
    not. InferPilot uses 0.01, but healthy SmolLM2 measured 0.0078 (CPU) and 0.0115 (H200, kveval's
    mixed sequences) — 0.01 would fail a healthy model. 0.03 leaves 2.6x headroom over the highest
    healthy figure while harmed caches (0.41-0.60) fail by 14-20x; a milder, systematic 0.05 still
    fails. Set 0.01 for InferPilot's rule on larger models, which drift less."""

    kl_p99_max: float = 0.5
    """99th-percentile per-position KL allowed before widening. Catches damage concentrated in
    few positions that the mean dilutes. InferPilot's 0.1 would fail healthy CPU (0.124), so the
    default is 0.5: 4x over healthy CPU, while harmed (4.3) fails by 8.6x."""

    noise_multiplier: float = 3.0
    """Budgets become max(threshold, multiplier × baseline-vs-baseline noise floor) (InferPilot),
    so a platform whose baseline already disagrees with itself is not held to an unreachable limit.
    Top-1 uses min(top1_agreement_min, 1 − multiplier × floor disagreement)."""

    top1_agreement_min: float = 0.85
    """Share of positions whose most likely token is the same in both cells. Healthy measured
    92.2-96.9 % (tiny models have many near-ties, so larger models sit higher; the batch-noise floor
    alone is 97.5 % on H200); harmed 47.9-80 %. 0.90 would leave a healthy run 2 points of margin."""

    max_new_degenerate_share: float = 0.05
    """Share of a cell's outputs allowed to show degeneration (loops, runaway length) that the
    baseline's output for the same prompt does not show. See new_degenerate_allowance."""

    new_degenerate_allowance: int = 1
    """New degenerate outputs always tolerated, whatever the share. Greedy outputs of a healthy
    fp8 cache diverge from auto after some tokens, and small models loop readily on both (FACTS.md:
    passkey misses loop in auto and fp8 alike), so one new loop is expected noise; the reported
    FP8 failures (runaway repetition, "!!!!" output, length blow-up) hit many outputs at once.
    A cell fails when new > max(allowance, share × outputs)."""

    task_recovery_min: float = 0.95
    """Long-context task accuracy recovery (cell accuracy / baseline accuracy at the same
    max_model_len, pooled over tasks, on the samples both cells scored; rejected samples are left
    out) that a cell must reach; the vLLM blog's 95 % recovery bar. Below it the cell fails when
    McNemar's exact test says the drop is significant (p < alpha), else the verdict is INCONCLUSIVE:
    too few samples to tell. Used only when task results exist."""

    alpha: float = 0.05
    """Significance level of McNemar's exact test on the discordant task samples (baseline right
    and cell wrong, or the reverse). A recovery drop that is not significant gives INCONCLUSIVE,
    not FAIL."""

    min_scored_tokens: int = 200
    """Fewer scored positions than this in a comparison -> INCONCLUSIVE. At 200 the standard error
    of a 90 % top-1 agreement is about 2 points, small enough to read the figures."""

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


_FIELDS = {f.name: f for f in dataclasses.fields(Thresholds)}
_SHARES = {"top1_agreement_min", "max_new_degenerate_share", "task_recovery_min", "alpha"}


def _coerce(key: str, value, source: str):
    """Value of the field's type. Numeric strings are accepted because YAML 1.1 reads `1e-2` as a
    string and CLI overrides arrive as text."""
    kind = _FIELDS[key].type
    kind = {"float": float, "int": int}.get(kind, kind) if isinstance(kind, str) else kind
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


def load_thresholds(path: str | Path | None = None, overrides: dict | None = None) -> Thresholds:
    """Dataclass defaults < YAML mapping at `path` < `overrides` (e.g. CLI options; None = unset)."""
    values: dict = {}
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


# --- verdict --------------------------------------------------------------------------------------

@dataclass
class Check:
    """One comparison of a figure with its limit; passed None = could not be made."""

    name: str
    cell: str | None
    value: float | None
    limit: float | None
    passed: bool | None
    detail: str = ""


@dataclass
class Reason:
    """A sentence explaining the verdict. level: FAIL, INCONCLUSIVE, or NOTE (does not decide)."""

    level: str
    cell: str | None
    message: str

    def __str__(self) -> str:
        return self.message


@dataclass
class Verdict:
    status: str
    reasons: list[Reason] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)
    thresholds: dict = field(default_factory=dict)
    noise_floor: dict | None = None

    def to_dict(self) -> dict:
        return {"status": self.status, "exit_code": exit_code(self),
                "reasons": [dataclasses.asdict(r) for r in self.reasons],
                "checks": [dataclasses.asdict(c) for c in self.checks],
                "thresholds": dict(self.thresholds), "noise_floor": self.noise_floor}


def exit_code(verdict: Verdict) -> int:
    return {PASS: EXIT_PASS, FAIL: EXIT_FAIL, INCONCLUSIVE: EXIT_INCONCLUSIVE}[verdict.status]


def _g(x) -> str:
    """Short figure for sentences: 0.0034, 0.41, 4.3."""
    return "n/a" if x is None else f"{x:.2g}" if abs(x) < 1 else f"{x:.3g}"


def _pct(x) -> str:
    return "n/a" if x is None else f"{100 * x:.1f} %"


class _Collector:
    """Accumulates checks and reasons; the status follows from the reasons' levels."""

    def __init__(self):
        self.checks: list[Check] = []
        self.reasons: list[Reason] = []

    def check(self, name, cell, value, limit, passed, detail="", reason=None, level=None):
        self.checks.append(Check(name, cell, value, limit, passed, detail))
        if reason:
            self.reasons.append(Reason(level or (FAIL if passed is False else INCONCLUSIVE if passed is None else NOTE),
                                       cell, reason))

    def note(self, cell, message, level=NOTE):
        self.reasons.append(Reason(level, cell, message))

    def status(self) -> str:
        levels = {r.level for r in self.reasons}
        return FAIL if FAIL in levels else INCONCLUSIVE if INCONCLUSIVE in levels else PASS


def _budget(threshold: float, multiplier: float, floor: float | None) -> tuple[float, str]:
    if floor is None:
        return threshold, f"threshold {_g(threshold)}, no noise floor measured"
    return max(threshold, multiplier * floor), f"max({_g(threshold)}, {_g(multiplier)} × noise floor {_g(floor)})"


def _kv_checks(out: _Collector, comp: dict, floor: dict | None, t: Thresholds) -> None:
    cell, s = comp["cell"], comp["summary"]
    if not comp.get("same_length", True):
        out.note(cell, f"{cell}: no started {comp.get('reference')} baseline at its own max_model_len; compared with "
                       f"{comp['reference']} on the sequences both scored")
    if s["n"] < t.min_scored_tokens:
        out.check("scored_tokens", cell, s["n"], t.min_scored_tokens, None, "too few scored positions",
                  f"{cell}: only {s['n']} scored positions vs {comp['reference']} (need {t.min_scored_tokens})")
        return
    floor = floor or {}
    for name, label, value, threshold, floor_value in (
            ("kl_mean", "KL mean", s["kl_mean"], t.kl_mean_max, floor.get("kl_mean")),
            ("kl_p99", "KL p99", s["kl_p99"], t.kl_p99_max, floor.get("kl_p99"))):
        limit, how = _budget(threshold, t.noise_multiplier, floor_value)
        passed = value <= limit
        out.check(name, cell, value, limit, passed, f"budget {how}",
                  None if passed else f"{cell}: {label} {_g(value)} > budget {_g(limit)} ({how})")
    disagreement = floor.get("top1_disagreement")
    limit = t.top1_agreement_min if disagreement is None else min(t.top1_agreement_min, 1 - t.noise_multiplier * disagreement)
    value, se = s["top1_agreement"], s.get("top1_agreement_se")
    if value is None:
        out.check("top1_agreement", cell, None, limit, None, "no top-k lists to compare")
        return
    passed = value >= limit
    out.check("top1_agreement", cell, value, limit, passed, f"±{_g(se)} (1 s.e.), n {s.get('top1_n')}",
              None if passed else f"{cell}: top-1 agreement {_pct(value)} < {_pct(limit)} (n {s.get('top1_n')})")


def _degeneration_checks(out: _Collector, degeneration: dict, cells: dict, baseline_kv: str, t: Thresholds) -> None:
    for cell, entry in sorted((degeneration or {}).get("cells", {}).items()):
        if (cells.get(cell) or {}).get("kv_cache_dtype") == baseline_kv:
            continue
        outputs, new = entry.get("outputs") or 0, entry.get("new_degenerate") or 0
        if not outputs:
            continue
        allowed = max(t.new_degenerate_allowance, t.max_new_degenerate_share * outputs)
        passed = new <= allowed
        share = new / outputs
        out.check("new_degenerate_share", cell, share, t.max_new_degenerate_share, passed,
                  f"{new} of {outputs} outputs newly degenerate; allowed {allowed:g}",
                  None if passed else f"{cell}: {new} of {outputs} outputs degenerate where the baseline's do not "
                                      f"({_pct(share)}; allowed max({t.new_degenerate_allowance}, "
                                      f"{_pct(t.max_new_degenerate_share)} of outputs))")


def _task_check(out: _Collector, name: str, result: dict, t: Thresholds) -> None:
    """Pooled-over-tasks recovery of one cell against its baseline; see the module docstring."""
    recovery, p, n = result.get("recovery"), result.get("mcnemar_p"), result.get("n")
    if not n:
        return
    if recovery is None:
        out.note(name, f"{name}: task accuracy recovery undefined: the {result.get('reference') or 'baseline'} "
                       f"cell answered none of the {n} paired samples correctly")
        return
    detail = (f"accuracy {_pct(result.get('cell_accuracy'))} vs {_pct(result.get('baseline_accuracy'))} on {n} "
              f"paired samples, McNemar p {_g(p)}")
    if recovery >= t.task_recovery_min:
        out.check("task_recovery", name, recovery, t.task_recovery_min, True, detail)
    elif p is not None and p < t.alpha:
        out.check("task_recovery", name, recovery, t.task_recovery_min, False, detail,
                  f"{name}: task accuracy recovery {_pct(recovery)} < {_pct(t.task_recovery_min)}, significant "
                  f"(McNemar p {_g(p)} < {t.alpha:g}, n {n}; {result.get('b')} samples only the baseline got "
                  f"right, {result.get('c')} only this cell)")
    else:
        out.check("task_recovery", name, recovery, t.task_recovery_min, None, detail,
                  f"{name}: task accuracy below the {_pct(t.task_recovery_min)} recovery bar, but too few samples "
                  f"to tell: recovery {_pct(recovery)}, McNemar p {_g(p)}, n {n}")


def _task_checks(out: _Collector, tasks: dict) -> None:
    for name, error in sorted((tasks.get("errors") or {}).items()):
        out.note(name, f"{name}: the long-context tasks phase failed ({' '.join(str(error).split())[:200]}); "
                       "its task accuracy is not judged")
    for name, by_task in sorted((tasks.get("task_errors") or {}).items()):
        out.note(name, f"{name}: failed tasks left out of its task accuracy: {', '.join(sorted(by_task))}")
    for entry in tasks.get("unmatched") or []:
        out.note(entry.get("cell"), f"{entry.get('cell')}: task accuracy not judged ({entry.get('reason')})")


def evaluate(evidence: dict, thresholds: Thresholds | None = None, baseline_kv: str = BASELINE_KV) -> Verdict:
    """PASS / FAIL / INCONCLUSIVE from stored evidence (see module docstring for the rules).

    Any failed check -> FAIL. Else a required check that could not be made (no non-baseline cell
    started, no baseline, too few scored tokens, no divergence data) or a task recovery drop that is
    not significant -> INCONCLUSIVE. Else PASS.
    A non-baseline cell that did not start is a capacity fact, reported as a note, not a failure.
    """
    t = thresholds or Thresholds()
    out = _Collector()
    cells = evidence.get("cells") or {}
    divergence = evidence.get("divergence") or {}
    floor = divergence.get("noise_floor")
    kv = {c["cell"]: c for c in divergence.get("comparisons", []) if c.get("kind") == "kv"}
    unmatched = {u["cell"]: u.get("reason") for u in divergence.get("unmatched", [])}

    candidates = sorted(name for name, c in cells.items() if c.get("kv_cache_dtype") != baseline_kv)
    started = [name for name in candidates if cells[name].get("started")]
    bases = [name for name, c in cells.items() if c.get("kv_cache_dtype") == baseline_kv and c.get("started")]
    for name in candidates:
        if not cells[name].get("started"):
            reason = cells[name].get("failure_reason") or "unknown reason"
            out.check("started", name, False, None, None, f"did not start ({reason}); reported in the start-up section",
                      f"{name}: did not start ({reason}: a start-up finding, not a quality failure); "
                      "its quality was not measured", level=NOTE)
    if not candidates:
        out.note(None, f"no cell other than {baseline_kv} in the run: nothing to judge", INCONCLUSIVE)
    elif not started:
        out.note(None, f"no {', '.join(sorted({cells[n].get('kv_cache_dtype') for n in candidates}))} cell started: "
                       "quality could not be measured", INCONCLUSIVE)
    if candidates and not bases:
        out.note(None, f"no {baseline_kv} baseline cell started: nothing to compare with", INCONCLUSIVE)
    if floor and floor.get("kl_mean") is not None and t.noise_multiplier * floor["kl_mean"] > t.kl_mean_max:
        out.note(None, f"baseline noise floor KL mean {_g(floor['kl_mean'])} widens the KL mean budget to "
                       f"{_g(t.noise_multiplier * floor['kl_mean'])}")

    for name in started:
        comp = kv.get(name)
        if comp is None:
            why = unmatched.get(name) or "no divergence data"
            if bases:  # without any baseline the run-level reason already says so
                out.check("divergence", name, None, None, None, why, f"{name}: no teacher-forced comparison ({why})")
            continue
        _kv_checks(out, comp, floor, t)

    _degeneration_checks(out, evidence.get("degeneration") or {}, cells, baseline_kv, t)
    tasks = evidence.get("tasks") or {}
    _task_checks(out, tasks)
    for name, result in sorted((tasks.get("cells") or {}).items()):
        _task_check(out, name, result, t)

    return Verdict(out.status(), out.reasons, out.checks, t.to_dict(), floor)
