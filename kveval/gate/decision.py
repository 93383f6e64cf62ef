"""The run's two answers and its exit code (issue 41). Pure: verdict, evidence and deploy answer in.

- asked: the configurations given with --kv (plain FP8), judged at every tested length: PASS when each
  of their started cells PASSes and nothing about the whole run is undecided, FAIL when one FAILs.
- deployable: whether any tested FP8 configuration (asked, remedy or search candidate) passes: PASS
  when the deploy line names one (render/headline.deployment: from its shortest tested length up to
  its cap), FAIL when every configuration is decided against (it failed, or did not start, at the
  first length it did not pass), else INCONCLUSIVE (one may still pass with more evidence).

Exit code: 0 when the asked configurations pass; EXIT_FOUND (4) when they do not but a deployable one
passes (0 with --require any); else the deployable answer's code (1 FAIL, 3 INCONCLUSIVE).
"""
from __future__ import annotations

from kveval.analysis.cell_records import BASELINE_KV
from kveval.files import schema
from kveval.gate.verdict import (EXIT_FOUND, EXIT_PASS, FAIL, INCONCLUSIVE, NOT_STARTED, PASS, REQUIRE, Verdict,
                                 status_exit_code)


# What each code a run exits with says, in the review's words (README "Exit codes" says more).
EXIT_MEANING = {0: "deployable as asked", EXIT_FOUND: "what was asked does not pass, this one does (0 with `kveval gate "
                "--require any`)", 1: "no tested FP8 configuration is deployable", 3: "undecided"}


def _run_undecided(verdict: Verdict) -> bool:
    """An INCONCLUSIVE reason about the whole run (no baseline, a missing baseline cell, nothing started)."""
    return any(reason.level == INCONCLUSIVE and reason.cell is None for reason in verdict.reasons)


def _statuses_by_spec(verdict: Verdict, evidence: schema.Evidence) -> dict[str, dict[int, str]]:
    """Per tested KV configuration: max_model_len -> its cell's status."""
    out: dict[str, dict[int, str]] = {}
    for name, status in verdict.cells.items():
        facts = evidence.cells.get(name)
        if facts is not None and facts.kv_spec != BASELINE_KV:
            out.setdefault(facts.kv_spec, {})[int(facts.max_model_len or 0)] = status
    return out


def asked_status(verdict: Verdict, by_spec: dict[str, dict[int, str]], asked: list[str]) -> schema.Status:
    """The verdict over the asked configurations' cells alone (evaluate's rule, remedies and candidates left out)."""
    statuses = [status for spec in asked for status in by_spec.get(spec, {}).values()]
    tested = [status for status in statuses if status != NOT_STARTED]
    if FAIL in tested:
        return FAIL
    if not tested or any(status != PASS for status in tested) or _run_undecided(verdict):
        return INCONCLUSIVE
    return PASS


def _may_still_pass(by_length: dict[int, str]) -> bool:
    """The first length (shortest first) it did not pass is undecided: more evidence may make it deployable."""
    first_other = next((status for _, status in sorted(by_length.items()) if status != PASS), None)
    return first_other not in (None, FAIL, NOT_STARTED)


def deployable_status(verdict: Verdict, by_spec: dict[str, dict[int, str]],
                      deployment: schema.Deployment) -> schema.Status:
    if deployment.configuration is not None:
        return PASS
    if not by_spec or _run_undecided(verdict) or any(_may_still_pass(lengths) for lengths in by_spec.values()):
        return INCONCLUSIVE
    return FAIL


def exit_code_of(asked: schema.Status, deployable: schema.Status, require: str = "plain") -> int:
    if require not in REQUIRE:
        raise ValueError(f"--require {require!r}: give one of {', '.join(REQUIRE)}")
    if asked == PASS:
        return EXIT_PASS
    if deployable == PASS:
        return EXIT_PASS if require == "any" else EXIT_FOUND
    return status_exit_code(deployable)


def asked_configurations(evidence: schema.Evidence, manifest: schema.Manifest | None) -> list[str]:
    """The FP8 configurations given with --kv (the manifest's); without a manifest, every tested one that
    is neither a remedy cell's nor a --search candidate past the ladder's first."""
    if manifest is not None:
        return [kv for kv in manifest.options.kv if kv != BASELINE_KV]
    remedy = set(evidence.remedy.cells) if evidence.remedy else set()
    ladder = evidence.search.candidates[1:] if evidence.search else []
    specs = {facts.kv_spec for name, facts in evidence.cells.items() if name not in remedy}
    return sorted(kv for kv in specs if kv and kv != BASELINE_KV and kv not in ladder)


def decide(verdict: Verdict, evidence: schema.Evidence, deployment: schema.Deployment,
           asked: list[str]) -> schema.Decision:
    by_spec = _statuses_by_spec(verdict, evidence)
    plain, deployable = asked_status(verdict, by_spec, asked), deployable_status(verdict, by_spec, deployment)
    return schema.Decision(asked=plain, asked_configurations=list(asked), deployable=deployable,
                           configuration=deployment.configuration, passes_at=list(deployment.passes_at),
                           max_model_len=deployment.max_model_len, exit_code=exit_code_of(plain, deployable),
                           exit_code_require_any=exit_code_of(plain, deployable, "any"))


def exit_code_for(decision: schema.Decision, require: str = "plain") -> int:
    """The run's exit code under `kveval gate --require` (ValueError for another word)."""
    return exit_code_of(decision.asked, decision.deployable, require)
