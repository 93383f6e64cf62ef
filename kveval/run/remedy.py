"""The way from an FP8 FAIL to a configuration that passes: which layers to keep in the model dtype,
and at which lengths to try it. Pure: reads the verdict, the evidence and the per-layer diagnosis.

Rule: for a plain FP8 spec that is not PASS at some max_model_len (FAIL, or INCONCLUSIVE when the
diagnosis names a cause: plain-vs-remedy is then the evidence that decides it), keep exactly the layers whose K or V
leave the FP8 range at the scale vLLM uses (`analysis.kv_range.plan_keep_layers`): the smallest set
that removes every saturating value, since a layer inside the range loses only rounding precision.
When no layer clips, the next candidates are the outlier layers (`analysis.kv_range.outlier_layers`:
a quarter of the limit and four times the median layer), where FP8's relative rounding loses the
most absolute detail. The remedied spec is tried at the lengths where plain FP8 failed (`always`:
every length where it started) and judged by the same gate, which also checks that the remedy is
sound (`analysis.attribution`). With neither kind of layer, or when the set is every layer (the `auto`
cache under another name), kveval has no layer set to propose, and the review says so for a FAIL; when
the remedied spec fails too, the headline says that nothing tried passes.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from kveval.analysis.kv_range import keeps_every_layer, plan_keep_layers
from kveval.files import schema
from kveval.gate import FAIL, INCONCLUSIVE, NOT_STARTED, Verdict
from kveval.analysis.cell_records import stored_spec
from kveval.inputs.kvspec import KVSpec, keep_spec

REMEDY_MODES = ("auto", "always", "off")


@dataclass(frozen=True)
class RemedyPlan:
    """What plan_remedy proposes: remedy cells not yet in the run, and the sentences that say why (or why none)."""
    cells: list[tuple[KVSpec, int]] = field(default_factory=list)   # (configuration, max_model_len)
    notes: list[str] = field(default_factory=list)


def plan_remedy(verdict: Verdict, evidence: schema.Evidence, mode: str = "auto") -> RemedyPlan:
    """The remedy cells not yet in the run, and the notes that say why."""
    if mode == "off":
        return RemedyPlan()
    cells = evidence.cells
    diagnoses = evidence.diagnosis
    planned, notes = [], []
    by_spec: dict[str, list[tuple[int, str]]] = {}
    undecided: set[str] = set()  # dtypes tried only because they are INCONCLUSIVE: no note without a cause
    for name, status in verdict.cells.items():
        facts = cells.get(name)
        spec = (stored_spec(facts.kv_spec) if facts else None) or KVSpec("auto")
        if spec.keep or not spec.dtype.startswith("fp8") or status in (NOT_STARTED, "MISSING"):
            continue
        if mode == "auto" and status not in (FAIL, INCONCLUSIVE):
            continue
        by_spec.setdefault(spec.dtype, []).append((facts.max_model_len, name))
        if status == INCONCLUSIVE and mode == "auto":
            undecided.add(f"{spec.dtype}-{facts.max_model_len}")
    for dtype, lengths in by_spec.items():
        diagnosis = diagnoses.get(dtype)
        measured = diagnosis if isinstance(diagnosis, schema.Diagnosis) and not diagnosis.error else None
        # analysis.kv_range reads the diagnosis as stored (a dict)
        clipping = plan_keep_layers(schema.dump(measured)) if measured else []
        only_undecided = all(f"{dtype}-{length}" in undecided for length, _ in lengths)
        if only_undecided and not (measured and (clipping or measured.outlier_layers)):
            continue  # nothing failed and no cause is named: no remedy, and nothing to say
        if measured is None:
            why = (diagnosis.error if diagnosis else None) or "the per-layer diagnosis did not run"
            notes.append(f"No remedy for {dtype}: {why}")
            continue
        keep, why = clipping, "their K or V leave the FP8 range"
        if not keep:
            keep = list(measured.outlier_layers or [])
            why = ("no layer clips, but their K or V peak within 4× of the FP8 limit and far above the other layers, "
                   "where FP8's 3-bit mantissa loses the most absolute detail")
        if not keep:
            notes.append(f"No remedy for {dtype}: no layer's K or V leaves or nears the FP8 range, so the damage is not "
                         "range-related and keeping layers in the model dtype is not expected to help")
            continue
        if keeps_every_layer(measured, keep):
            what = "K or V leave the FP8 range" if clipping else "K or V peak near the FP8 limit"
            notes.append(f"No remedy for {dtype}: {what} in all {len(set(keep))} layers, and keeping them all in the "
                         "model dtype is the `auto` cache: no capacity to gain; calibrated K/V scales (`--search`) are "
                         "what could bring those values into the FP8 range")
            continue
        spec = keep_spec(dtype, keep)
        for length, _ in sorted(lengths):
            if f"{spec.text}-{length}" not in cells:
                planned.append((spec, length))
        notes.append(f"Remedy for {dtype}: keep layer{'s' if len(keep) > 1 else ''} {', '.join(map(str, keep))} in the "
                     f"model dtype ({why}), tried at {', '.join(str(length) for length, _ in sorted(lengths))} "
                     f"as `{spec.text}`")
    return RemedyPlan(planned, notes)
