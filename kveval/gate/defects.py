"""Engine-path defects: a remedy cell far worse than plain FP8, identical figures for two specs, a
stalled engine, failed requests, kept layers on FlashAttention. A defective cell's FAIL becomes
INCONCLUSIVE."""
from __future__ import annotations

from kveval.analysis.cell_records import BASELINE_KV
from kveval.files import schema
from kveval.gate.collector import _Collector, _g
from kveval.gate.thresholds import Budget, Thresholds
from kveval.gate.verdict import FAIL, INCONCLUSIVE


def _layers(kept: list[str]) -> str:
    return ("layer " if len(kept) == 1 else "layers ") + ", ".join(str(k) for k in kept)


def _remedy_defect(pair: schema.Attribution, budget: Budget, t: Thresholds) -> str | None:
    """Why the remedy cell of `pair` cannot be sound, or None. Keeping layers in the model dtype can
    only remove quantization error; a remedy much worse than plain FP8 is a broken engine path.

    "Worse" is the one-sided sign-flip test by sequence (analysis/attribution.py) that the remedy's KL
    is above plain FP8's, overall and in each position range; a defect turns FAIL reasons into
    INCONCLUSIVE, so its tests share `t.fail_alpha` equally (Bonferroni): under the null hypothesis that
    the kept layers do not matter, a defect is claimed with probability at most fail_alpha."""
    plain, remedy = pair.plain_kl_mean, pair.remedy_kl_mean
    # Evidence from before the test by sequence (no n_sequences) carries the block test's p: not used.
    if plain is None or remedy is None or pair.n_sequences is None:
        return None
    tests = 1 + sum(1 for bucket in pair.buckets if bucket.p_remedy_worse is not None)
    level = t.fail_alpha / tests
    shown = f"p < {level:.2g}" if tests == 1 else f"p < {level:.2g}, {t.fail_alpha:g} shared by {tests} tests"
    sound_before = False  # a position range where the remedy is not worse: the breakage starts later
    for bucket in pair.buckets:
        b_plain, b_remedy, b_p = bucket.plain_kl_mean, bucket.remedy_kl_mean, bucket.p_remedy_worse
        if b_plain is None or b_remedy is None:
            continue
        worse = (b_remedy >= t.defect_factor * b_plain and b_remedy > budget.kl_late_max
                 and bucket.n >= t.min_late_tokens and b_p is not None and b_p < level)
        if worse and sound_before:
            return (f"at positions {bucket.bucket} its KL mean is {_g(b_remedy)} against plain FP8's {_g(b_plain)} "
                    f"(sign-flip test over {bucket.n_sequences} scored sequences, p {_g(b_p)}; {shown}), while "
                    "earlier positions are sound: the kept-layer cache breaks with position")
        sound_before = sound_before or b_remedy <= max(t.defect_factor * b_plain, budget.kl_mean_max)
    p = pair.p_remedy_worse
    if remedy >= t.defect_factor * plain and remedy > budget.kl_mean_max and p is not None and p < level:
        return (f"its KL mean {_g(remedy)} is {remedy / plain:.1f}× plain FP8's {_g(plain)} on the same positions "
                f"(sign-flip test over {pair.n_sequences} scored sequences, p {_g(p)}; {shown})")
    return None


def _defects(out: _Collector, evidence: schema.Evidence, budget: Budget, t: Thresholds) -> list[schema.Defect]:
    """Engine-path defects: a remedy far worse than plain FP8, two specs with identical figures, or a cell
    whose engine stopped making progress (run/cell_process.py stops it as stalled).
    The defective cell's FAIL reasons become INCONCLUSIVE: its figures do not measure FP8 quality."""
    defects: list[schema.Defect] = []
    for pair in evidence.attribution or []:
        why = _remedy_defect(pair, budget, t)
        if why:
            defects.append(schema.Defect(cell=pair.remedy, message=f"{pair.remedy} looks broken, not FP8-damaged: {why}. "
                                                                   f"Keeping {_layers(pair.kept)} in the model dtype "
                                                                   "cannot do that in a correct engine"))
    errors = _engine_errors(evidence)
    stalled = {row.cell: row.crash for row in evidence.startup if row.crash_cause == "stalled"}
    for cell, crash in stalled.items():
        defects.append(schema.Defect(cell=cell, message=f"{cell}: {crash}; an engine that hangs is broken on this "
                                                        "configuration, which says nothing of FP8 quality"
                                                        + errors.pop(cell, "")))
    for cell, said in errors.items():
        defects.append(schema.Defect(cell=cell, message=f"{cell}: the engine failed requests that `{BASELINE_KV}` "
                                                        f"served{said}: a configuration the engine cannot serve "
                                                        "reliably is not one to deploy, whatever its quality figures"))
    for same in evidence.identical_specs or []:
        first, second = same.cells
        defects.append(schema.Defect(cell=second, message=f"{first} and {second} have identical per-position figures "
                                                          f"on {same.n_positions} positions: the kept-layer setting "
                                                          "did not reach the engine (vLLM ignored it, or kveval did "
                                                          "not pass it)"))
    defects += _kept_layers_on_fa3(out, evidence, {d.cell for d in defects})
    # A stalled cell's missing phases are explained by the stall: their "not measured" reasons would
    # only send the reader after a baseline that is there.
    out.reasons = [r for r in out.reasons if not (r.cell in stalled and r.level == INCONCLUSIVE)]
    for defect in defects:
        for reason in out.reasons:
            if reason.cell == defect.cell and reason.level == FAIL:
                reason.level = INCONCLUSIVE
                reason.decide = "not judged as FP8 damage: see the defect"
        out.reason(INCONCLUSIVE, defect.cell, defect.message,
                   "a defect of the engine path (or of kveval), not of the model's FP8 quality: try another vLLM "
                   "version or attention backend, and report it with the cell's log", code="engine_defect")
    return defects


# The engine path behind the KL 13.8 run (reports/h200-qwen2.5-coder-1.5b-keep-layers-bisect): vLLM 0.26's
# FlashAttention builds FA3's ahead-of-time schedule with the global fp8 dtype for layers kept in bf16.
KEPT_LAYERS_DEFECTIVE_BACKEND = "FLASH_ATTN"


def _kept_layers_on_fa3(out: _Collector, evidence: schema.Evidence, known: set[str]) -> list[schema.Defect]:
    """A cell that keeps layers, ran them on FlashAttention and FAILs: that path is known to turn the
    kept layers to garbage (it did so on the H200 with --gpu-memory-utilization 0.5 --enforce-eager, KL
    13.8, and served them well with defaults), so its failure is not evidence about FP8."""
    defects: list[schema.Defect] = []
    for row in evidence.startup:
        cell = row.cell
        if (cell in known or row.attention_backend != KEPT_LAYERS_DEFECTIVE_BACKEND
                or ":keep=" not in (row.kv_spec or "") or FAIL not in out.levels(cell)):
            continue
        defects.append(schema.Defect(
            cell=cell, message=f"{cell}: its kept layers ran on FlashAttention (FA3), whose ahead-of-time schedule "
                               "vLLM 0.26 builds with the global fp8 dtype for layers kept in the model dtype; that "
                               "path has turned them to garbage (KL 13.8 on the H200, where the same cells pass on "
                               "default settings), so this FAIL says nothing of FP8 quality. Run kept layers on "
                               "TRITON_ATTN (kveval's choice unless --engine-arg attention_backend=... says otherwise)"))
    return defects


def _engine_errors(evidence: schema.Evidence) -> dict[str, str]:
    """Tested cells whose engine raised errors on requests (not refusals of over-long prompts) while the
    `auto` cells raised none: cell -> a clause quoting vLLM's first message, e.g. FA3's
    "scheduler_metadata must have shape (metadata_size)" on layers kept in bf16 (vLLM 0.26)."""
    rows = [r for r in evidence.acceptance.rejections if r.kind == "error"]
    if any(r.cell.startswith(f"{BASELINE_KV}-") for r in rows):
        return {}
    found: dict[str, list[str]] = {}
    for row in rows:
        found.setdefault(row.cell, []).append(" ".join((row.message or "").split())[:200])
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
