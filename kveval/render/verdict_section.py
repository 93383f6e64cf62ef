"""The review's verdict section: the status and headline, the decision table (render/decision_table.py),
the configuration to deploy, the reasons (or the checks that passed), the divergence budgets, the
thresholds and the noise floor. Pure: verdict, evidence
and manifest in, markdown out.
"""
from __future__ import annotations

import dataclasses

from kveval.analysis.cell_records import BASELINE_KV
from kveval.files import schema
from kveval.gate import NOTE, PASS, Thresholds, Verdict
from kveval.render.decision_table import decision_table
from kveval.gate.decision import EXIT_MEANING
from kveval.render.headline import decision_of, deployment_lines, deployment_of, headline
from kveval.render.markdown import bullet, fmt_share, fmt_sig


def _check_phrase(check) -> str:
    """A passed check in a few words, e.g. "KL mean 0.0034 ≤ 0.02"."""
    if check.name == "kl_mean":
        return f"KL mean {check.detail}"
    if check.name == "top1_agreement":
        return f"top-1 agreement {fmt_share(check.value)}, {check.detail}"
    if check.name == "new_degenerate_share":
        return check.detail
    if check.name == "degeneration_noninferiority":
        return f"degeneration excess upper bound {fmt_share(check.value)} < {fmt_share(check.limit)} ({check.detail})"
    if check.name == "kl_late_mean":
        return f"KL mean (late) {check.detail}"
    if check.name == "task_noninferiority":
        return f"task recovery lower bound {fmt_share(check.value)} ≥ {fmt_share(check.limit)} ({check.detail})"
    if check.name == "task_recovery":
        return f"task recovery {fmt_share(check.value)} ({check.detail})"
    return f"{check.name} {fmt_sig(check.value)} (limit {fmt_sig(check.limit)})"


def _passed_lines(verdict: Verdict) -> list[str]:
    by_cell: dict[str, list[str]] = {}
    for check in verdict.checks:
        if check.passed:
            by_cell.setdefault(check.cell or "run", []).append(_check_phrase(check))
    return [bullet(f"{cell}: {'; '.join(phrases)}") for cell, phrases in by_cell.items()]


def _thresholds_line(thresholds: Thresholds) -> str:
    pairs = " ".join(f"{key}={value:g}" if isinstance(value, (int, float)) else f"{key}={value}"
                     for key, value in dataclasses.asdict(thresholds).items() if value is not None)
    return (f"Thresholds: `{pairs}` (change with `--threshold KEY=VALUE` or `--gate-config FILE.yaml`; "
            "see the README).")


def _noise_floor_line(floor: schema.NoiseFloor | None) -> str:
    if floor is None:
        return (f"Noise floor: not measured (no `{BASELINE_KV}` cell scored twice or at two max_model_len values), "
                "so the thresholds apply unwidened.")
    sources = ", ".join(
        f"{s.cell} re-scored in another batch (n {s.n:,})" if s.kind == "noise_batch"
        else f"{s.cell} vs {s.reference} (n {s.n:,})" for s in floor.source)
    return (f"Noise floor ({BASELINE_KV} vs itself, worst of: {sources}): KL mean {fmt_sig(floor.kl_mean)}, "
            f"KL p99 {fmt_sig(floor.kl_p99)}, top-1 disagreement {fmt_share(floor.top1_disagreement)}. "
            "Budgets are max(threshold, noise_multiplier × floor).")


def _reason_line(reason) -> str:
    text = reason.message + (f" — **to decide:** {reason.decide}" if reason.decide else "")
    return bullet(text)


def _profile_line(verdict: Verdict) -> str:
    profile = verdict.profile
    if profile is None:
        return ""
    budget = profile.budget
    return (f"Divergence budgets: **{profile.name} profile** ({profile.why}; {profile.calibration}): "
            f"PASS when the upper bound of the KL excess over the noise floor is under {fmt_sig(budget.kl_mean_max)} "
            f"(late positions {fmt_sig(budget.kl_late_max)}) and the lower bound of top-1 agreement at least "
            f"{fmt_share(budget.top1_agreement_min)}; FAIL when the lower bound of the KL excess is over "
            f"{fmt_sig(budget.kl_mean_fail)} (late {fmt_sig(budget.kl_late_fail)}). Bounds are one-sided, "
            "with the scored sequences as the unit (docs/statistics.md).")


def _asked(decision: schema.Decision) -> str:
    return ", ".join(f"`{kv}`" for kv in decision.asked_configurations) or "nothing"


def decision_line(decision: schema.Decision) -> str:
    """The second verdict, under the heading's first: is any tested FP8 configuration deployable, and the exit code."""
    if decision.configuration is not None:
        which = f"`{decision.configuration}` up to --max-model-len {decision.max_model_len}"
    else:
        # FAIL: none passed, or what passed holds no more KV than `auto` (the deploy line says which)
        which = "none to deploy" if decision.deployable != "INCONCLUSIVE" else "none has passed yet"
    return (f"Deployable FP8 configuration: **{decision.deployable}** ({which}) · exit code {decision.exit_code}: "
            f"{EXIT_MEANING[decision.exit_code]}")


def _joined(lines: list[str]) -> list[str]:
    """The deploy line and the short lines under it, as one markdown paragraph with hard line breaks (a
    backslash ends each line but the last)."""
    return [line + ("\\" if index < len(lines) - 1 else "") for index, line in enumerate(lines)]


def verdict_section(verdict: Verdict, evidence: schema.Evidence, manifest: schema.Manifest) -> str:
    model_dtype = manifest.model.dtype or "bf16"
    deployment = deployment_of(verdict, evidence, manifest)
    decision = decision_of(verdict, evidence, manifest, deployment)
    # The heading answers what was asked (--kv); the line under it whether anything tested is deployable.
    out = [f"## Verdict: **{decision.asked}** ({_asked(decision)} as asked)", "", decision_line(decision), "",
           f"**{headline(verdict, evidence, model_dtype)}**", ""]
    decisions = decision_table(verdict, evidence)
    if decisions:
        out += [decisions, ""]
    out += [*_joined(deployment_lines(deployment)), ""]
    deciding = [r for r in verdict.reasons if r.level == verdict.status]
    if verdict.status == PASS:
        out += ["Every required check passed:", "", *(_passed_lines(verdict) or ["- (no check was needed)"])]
    else:
        out += ["Why:", "", *(_reason_line(r) for r in deciding)]
    others = [r for r in verdict.reasons if r.level != verdict.status]
    if others:
        out += ["", "Also noted:", ""]
        out += [_reason_line(r) if r.level == NOTE else bullet(f"({r.level.lower()}) {r.message}"
                                                               + (f" — to decide: {r.decide}" if r.decide else ""))
                for r in others]
    out += ["", _profile_line(verdict), "", _thresholds_line(verdict.thresholds), "", _noise_floor_line(verdict.noise_floor)]
    return "\n".join(line for line in out if line is not None)
