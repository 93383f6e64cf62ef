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
from what the run recorded (`evidence.platform`); the review names the profile. A threshold set by
the user (`--threshold`, YAML) overrides the profile on every platform.
"""
from __future__ import annotations

import dataclasses

from kveval.analysis.cell_records import BASELINE_KV
from kveval.files import schema
from kveval.gate.attribution import _attribute
from kveval.gate.collector import _Collector, _g
from kveval.gate.defects import _defects
from kveval.gate.degeneration_checks import _degeneration
from kveval.gate.divergence_checks import _divergence
from kveval.gate.task_checks import _tasks
from kveval.gate.thresholds import DEFAULT_PROFILE, PROFILES, UNCALIBRATED_NOISE_MULTIPLIER, Budget, Thresholds
from kveval.gate.verdict import FAIL, INCONCLUSIVE, NOT_STARTED, NOTE, PASS, Verdict


def _cell_status(out: _Collector, cell: str) -> schema.Status:
    levels = out.levels(cell)
    return FAIL if FAIL in levels else INCONCLUSIVE if INCONCLUSIVE in levels else PASS


def _uncalibrated_cells(evidence: schema.Evidence, comparisons: dict[str, schema.Comparison],
                        started: list[str]) -> set[str]:
    """Tested cells whose backend and device, or their baseline's, no budget was calibrated on (evidence
    cells[].calibrated, issue 38); cells from before say nothing and are judged as before."""
    cells = evidence.cells
    found = set()
    for name in started:
        comparison = comparisons.get(name)
        reference = cells.get(comparison.reference) if comparison and comparison.reference else None
        if cells[name].calibrated is False or (reference is not None and reference.calibrated is False):
            found.add(name)
    return found


def _uncalibrated_note(out: _Collector, where: list[str], floor: schema.NoiseFloor | None, budget: Budget,
                       multiplier: float) -> None:
    """The one line saying the budget is uncalibrated on this backend and device, and what it was judged against."""
    base = (f"the GPU profile's budgets (calibrated on NVIDIA compute capability 9.x, FLASH_ATTN/FA3) widened to "
            f"{multiplier:g}× this run's auto-vs-auto noise floor")
    if floor is None or floor.kl_mean is None:
        against = f"{base}, but no noise floor was measured, so the budgets stand unwidened (KL mean {_g(budget.kl_mean_max)})"
    else:
        widened = max(budget.kl_mean_max, multiplier * float(floor.kl_mean))
        against = f"{base} (floor KL mean {_g(floor.kl_mean)}: KL mean budget {_g(widened)})"
    out.reason(NOTE, None, f"divergence budget uncalibrated on {'; '.join(where) or 'this backend'}: judged against "
                           f"{against}", code="uncalibrated_backend")


def _baseline_options(baseline_kv: str) -> str:
    """What would give a baseline where `auto` cannot hold the length on this budget (issue 39)."""
    return (f"the {baseline_kv} cache cannot hold this length here: give --baseline-from RUN_DIR, a baseline run made "
            f"where it fits (`kveval baseline --model M --max-model-len N` on a larger GPU or a CPU), or "
            f"--reference offload (a quality-only {baseline_kv} cell on this card with weights moved to host memory; "
            "slow), or let the quality reference start on an emulated budget (--kv-cache-memory)")


def _reference_note(name: str, cell: str, reference: schema.QualityReference, baseline_kv: str) -> str:
    """The one line saying what a cell was judged against where `auto` did not start (run/reference.py)."""
    if reference.cpu_offload_gb:
        how = (f"on the same share of the card with {reference.cpu_offload_gb:g} GiB of weights offloaded to host "
               "memory (cpu_offload_gb), for quality only (not a capacity or speed figure)")
        return f"{name} is judged against {cell}: {reference.for_} did not start on this card's memory, so kveval " \
               f"started `{baseline_kv}` at this length {how}"
    return (f"{name} is judged against {cell}: {reference.for_} did not start on the run's KV budget, so kveval "
            f"started `{baseline_kv}` at this length with {(reference.kv_cache_memory_bytes or 0) / 2 ** 20:,.0f} MiB "
            "for quality only (not a capacity figure)")


def _imported_note(imported: schema.ImportedBaseline, profile: str, multiplier: float) -> str:
    """The one line naming where an imported baseline was measured, and how the budget accounts for it."""
    origin = imported.origin
    where = ", ".join(x for x in (origin.host, origin.gpu, f"vLLM {origin.vllm or 'unknown'}",
                                  origin.attention_backend or "unknown attention backend") if x)
    line = (f"the auto baseline ({', '.join(imported.cells)}) was imported from {imported.source} (made "
            f"{imported.created} on {where}): quality only, never a capacity, speed or time figure of this run")
    if not imported.cross_machine:
        return line + "; made on this machine"
    differs = f" ({'; '.join(imported.differences)})" if imported.differences else ""
    return (line + f"; made on another machine{differs}, so it carries the difference between the two platforms: "
            f"divergence is judged on the wider of the two profiles ({profile}) with the KL budgets widened to "
            f"{multiplier:g}× the baseline run's own auto-vs-auto noise floor (docs/statistics.md)")


def evaluate(evidence: schema.Evidence, thresholds: Thresholds | None = None,
             baseline_kv: str = BASELINE_KV) -> Verdict:
    """PASS / FAIL / INCONCLUSIVE from evidence (rules: module docstring), with a status per tested cell.

    The run is FAIL when any tested cell FAILs, PASS when every tested cell that started PASSes (at
    least one did and none is missing), else INCONCLUSIVE. A cell that did not start is a capacity
    finding (NOT STARTED), not a quality failure.
    """
    t = thresholds or Thresholds()
    out = _Collector()
    cells = evidence.cells
    platform = evidence.platform
    profile = platform.profile if platform.profile in PROFILES else DEFAULT_PROFILE
    imported = evidence.imported_baseline
    cross = imported is not None and imported.cross_machine
    if imported is not None and cross and imported.origin.profile in PROFILES and \
            t.budget(imported.origin.profile).kl_mean_max > t.budget(profile).kl_mean_max:
        profile = imported.origin.profile   # a baseline from another platform: the wider of the two profiles
    budget = t.budget(profile)
    divergence = evidence.divergence
    floor = divergence.noise_floor
    comparisons = {c.cell: c for c in divergence.comparisons if c.kind == "kv"}
    unmatched_div = {u.cell: u.reason for u in divergence.unmatched}
    degeneration = evidence.degeneration.cells
    tasks = evidence.tasks if isinstance(evidence.tasks, schema.TaskEvidence) else None  # {}: no cell ran tasks
    task_cells = tasks.cells if tasks else {}
    task_unmatched = {u.cell: u.reason for u in tasks.unmatched} if tasks else {}
    task_errors = tasks.errors if tasks else {}
    tasks_planned = evidence.tasks_planned
    pace = tasks.pace if tasks else None

    missing = [name for name, c in cells.items() if c.missing]
    statuses: dict[str, schema.CellStatus] = {}
    for name in missing:
        statuses[name] = "MISSING"
        out.reason(INCONCLUSIVE, None if cells[name].kv_spec == baseline_kv else name,
                   f"{name}: planned but has no result file (deleted, or the run stopped before it finished); "
                   "nothing it would have measured is judged",
                   "run the same command again with the same --out: finished cells are kept, missing ones are measured",
                   code="missing_result")
    candidates = [n for n, c in cells.items() if c.kv_spec != baseline_kv and not c.missing]
    started = [n for n in candidates if cells[n].started]
    bases = [n for n, c in cells.items() if c.kv_spec == baseline_kv and c.started]
    for name in candidates:
        if not cells[name].started:
            reason = cells[name].failure_reason or "unknown reason"
            out.check("started", name, None, None, None, f"did not start ({reason})")
            out.reason(NOTE, name, f"{name}: did not start ({reason}: a start-up finding, not a quality failure); "
                                   "its quality was not measured", code="not_started")
            statuses[name] = NOT_STARTED
    if not candidates and not missing:
        out.reason(INCONCLUSIVE, None, f"no cell other than {baseline_kv} in the run: nothing to judge",
                   "add the KV dtype to test, e.g. --kv fp8 auto", code="nothing_to_judge")
    elif candidates and not started and any(c.kv_spec == baseline_kv and not c.missing for c in cells.values()) \
            and not bases:
        # Not an FP8 finding: whatever stopped the engine stopped it with the model dtype's cache too.
        out.reason(INCONCLUSIVE, None, f"no cell started, the {baseline_kv} baseline included: vLLM could not start "
                                       "this model here in any KV configuration, so nothing points at FP8",
                   "see the start-up section for vLLM's reason (the model, the engine or the memory)",
                   code="nothing_started")
    elif candidates and not started:
        out.reason(INCONCLUSIVE, None, "no tested cell started: quality could not be measured",
                   "see the start-up section for vLLM's reason", code="no_tested_cell_started")
    if started and not bases:
        too_small = any(c.kv_spec == baseline_kv and c.failure_reason == "kv_capacity" for c in cells.values())
        out.reason(INCONCLUSIVE, None, f"no {baseline_kv} baseline cell started: nothing to compare with",
                   _baseline_options(baseline_kv) if too_small else
                   f"let a {baseline_kv} cell start (the start-up section says why it did not)", code="no_baseline")
    if imported is not None:
        out.reason(NOTE, None, _imported_note(imported, profile, max(t.noise_multiplier, UNCALIBRATED_NOISE_MULTIPLIER)),
                   code="imported_baseline")
    if floor and floor.kl_mean is not None and t.noise_multiplier * floor.kl_mean > budget.kl_mean_max:
        out.reason(NOTE, None, f"baseline noise floor KL mean {_g(floor.kl_mean)} widens the KL mean budget to "
                               f"{_g(t.noise_multiplier * floor.kl_mean)}", code="noise_floor_widens_budget")

    # --search keeps the first PASS among its candidates: each PASS is tested at alpha / (candidates it may
    # try), the Bonferroni correction, so a false PASS anywhere on the ladder stays within alpha.
    tried = t
    if evidence.search is not None:
        ladder = len(evidence.search.candidates) + len(evidence.search.unavailable or {})
        if ladder > 1:
            tried = dataclasses.replace(t, alpha=t.alpha / ladder)
            out.reason(NOTE, None, f"--search may try {ladder} configurations: each cell's PASS is tested at alpha "
                                   f"{t.alpha:g} / {ladder} = {tried.alpha:.3g} (Bonferroni), and each FAIL path at "
                                   f"{tried.fail_alpha:.3g}", code="search_corrected")
    uncalibrated = _uncalibrated_cells(evidence, comparisons, started)
    if uncalibrated:
        _uncalibrated_note(out, platform.uncalibrated or [], floor, budget,
                           max(t.noise_multiplier, UNCALIBRATED_NOISE_MULTIPLIER))
    widened = uncalibrated | (set(started) if cross else set())   # judged on the floor times the wider multiplier
    references = evidence.quality_references or {}
    for name in started:
        comparison = comparisons.get(name)
        reference = references.get(comparison.reference) if comparison else None
        if comparison is not None and reference is not None:
            out.reason(NOTE, name, _reference_note(name, comparison.reference, reference, baseline_kv),
                       code="quality_reference")
        _divergence(out, name, comparison, unmatched_div.get(name) or "no divergence data", floor, budget,
                    dataclasses.replace(tried, noise_multiplier=max(tried.noise_multiplier, UNCALIBRATED_NOISE_MULTIPLIER))
                    if name in widened else tried)
        _degeneration(out, name, degeneration.get(name), tried)
        _tasks(out, name, task_cells.get(name), tasks_planned, task_unmatched.get(name), task_errors.get(name), pace,
               tried)
        for task_name in sorted((tasks.task_errors.get(name) or {}) if tasks else {}):
            out.reason(NOTE, name, f"{name}: task {task_name} failed and is left out of its task accuracy",
                       code="task_left_out")
        statuses[name] = _cell_status(out, name)

    defects = _defects(out, evidence, budget, t)
    attributed = _attribute(out, evidence, {d.cell for d in defects}, t)
    for name in started:
        statuses[name] = _cell_status(out, name)

    run_levels = out.levels(None)
    tested = [statuses[n] for n in started]
    status: schema.Status
    if FAIL in tested:
        status = FAIL
    elif INCONCLUSIVE in tested or INCONCLUSIVE in run_levels or not tested or missing:
        status = INCONCLUSIVE
    else:
        status = PASS
    why = (f"the wider of this run's ({platform.why}) and the imported baseline's ({imported.origin.profile}) "
           "profiles" if imported is not None and cross and platform.why else platform.why or PROFILES[profile][1])
    return Verdict(status, out.reasons, out.checks, t, floor, statuses,
                   schema.Profile(name=profile, why=why, calibration=PROFILES[profile][1],
                                  budget=schema.Budget(**dataclasses.asdict(budget))),
                   defects, attributed)
