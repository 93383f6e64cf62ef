"""The review's calibration section (issue 20): which checkpoint each `fp8:scaled` spec loaded, what it
was calibrated on, and per layer the scales next to the measured K/V ranges. Pure: evidence in,
markdown out.

vLLM stores fp8(x / scale): a layer's FP8 limit is 448 × its scale (e4m3). At scale 1.0 that is ±448
whatever the model's range; a calibrated scale fits the limit to the range the calibration text
reached, so `max |K| / limit` near 1 means the calibration used the whole FP8 range on that layer.
With per-head scales each head has its own limit, and the range pass measures a layer's max, not each
head's: the table gives the range of a layer's head scales, and bounds on the worst head's ratio (its own
max over its own limit) that follow from the layer's max: at least max ÷ the largest limit (the head that
holds the max has at most that limit), at most max ÷ the smallest limit.
"""
from __future__ import annotations

from typing import Any

import pandas as pd
from pydantic import BaseModel, ConfigDict

from kveval.analysis.kv_range import FP8_MAX
from kveval.files import schema
from kveval.render.markdown import bullet, escape_cell, fmt_sig, long_table

_E4M3 = FP8_MAX["fp8_e4m3"]
_WORDS = {"tensor": "per-tensor", "head": "per-attention-head"}


def _measured(evidence: schema.Evidence) -> dict[tuple[int, str], float]:
    """(layer, "k"/"v") -> max |value| the K/V range pass measured on the scoring text."""
    out: dict[tuple[int, str], float] = {}
    for diagnosis in evidence.diagnosis.values():
        if isinstance(diagnosis, schema.Diagnosis):
            for row in diagnosis.rows:
                if row.absmax is not None:
                    out[(row.layer, row.tensor)] = max(out.get((row.layer, row.tensor), 0.0), float(row.absmax))
    return out


def _ratio(peak: float | None, limit: float | None) -> str:
    return fmt_sig(peak / limit if peak is not None and limit else None)


def _scale_rows(entry: schema.CalibrationEntry, measured: dict[tuple[int, str], float]) -> pd.DataFrame:
    scales = entry.scales
    per_head = scales.per_head or {}
    layers = sorted({int(layer) for layer in [*scales.k_scale, *scales.v_scale]})
    rows = []
    for layer in layers:
        row = {"layer": layer}
        for tensor, given in (("K", scales.k_scale), ("V", scales.v_scale)):
            name = f"{tensor.lower()}_scale"
            peak = measured.get((layer, tensor.lower()))
            row[f"max |{tensor}| measured"] = fmt_sig(peak)
            head_scales = [s for s in (per_head.get(name) or {}).get(str(layer)) or [] if s > 0]
            if head_scales:   # module doc: the worst head's ratio lies between these bounds
                low, high = min(head_scales) * _E4M3, max(head_scales) * _E4M3
                row[f"{name} (heads)"] = f"{fmt_sig(min(head_scales))}–{fmt_sig(max(head_scales))}"
                row[f"{tensor} limit (448 × scale)"] = f"{fmt_sig(low)}–{fmt_sig(high)}"
                row[f"worst head's max |{tensor}| / limit"] = (f"{_ratio(peak, high)}–{_ratio(peak, low)}"
                                                              if peak is not None else fmt_sig(None))
                continue
            scale = given.get(str(layer))
            limit = None if scale is None else scale * _E4M3
            row[name] = fmt_sig(scale)
            row[f"{tensor} limit (448 × scale)"] = fmt_sig(limit)
            row[f"max |{tensor}| / limit"] = _ratio(peak, limit)
        rows.append(row)
    return pd.DataFrame(rows)


class _Provenance(BaseModel):
    """A calibration entry's record as the review names it: files/calibration.CalibrationRecord for a copy
    kveval calibrated, {"source": ...} for scales the model carries. Values are shown as stored (a record's
    seconds may be an int), so nothing is converted."""

    model_config = ConfigDict(extra="ignore")

    source: Any = None
    documents: Any = None
    seconds: Any = None
    device: Any = None
    llmcompressor: Any = None
    compressed_tensors: Any = None
    samples: Any = None
    tokens: Any = None


def calibration_section(evidence: schema.Evidence) -> str:
    if not evidence.calibration:
        return ""
    measured = _measured(evidence)
    out = ["## Calibrated scales", ""]
    for word, entry in evidence.calibration.items():
        spec = "fp8:scaled" if word == "tensor" else f"fp8:scaled={word}"
        record = _Provenance.model_validate(entry.record)
        if not entry.calibrated_by_kveval:
            out += [bullet(f"`{spec}`: the model carries its own K/V scales ({escape_cell(record.source)}); "
                           "they were used as they are, nothing was calibrated."), ""]
        else:
            documents = ", ".join(str(name) for name in record.documents or [])
            made = ("reused from an earlier run" if entry.reused else
                    f"made in this run in {record.seconds} s on {record.device}")
            out += [bullet(f"`{spec}`: {_WORDS.get(word, word)} K/V scales calibrated with llm-compressor "
                           f"{record.llmcompressor} (compressed-tensors {record.compressed_tensors}, "
                           f"kv_cache_scheme: 8-bit float, static, symmetric) on {record.samples} samples, "
                           f"{record.tokens} tokens of kveval's calibration text ({escape_cell(documents)}), "
                           "which no prompt, scored document or task uses; " + made + "."),
                    bullet(f"Checkpoint vLLM loads: `{escape_cell(entry.path, None)}`; Q keeps vLLM's default scale "
                           "1.0 (only K and V are calibrated)."), ""]
        if entry.scales.per_head:
            out += ["Per-head scales: each layer's head scales and limits are given as ranges (smallest–largest). "
                    "The range pass measures each layer's max, not each head's, so the worst head's ratio (its own "
                    "max over its own limit) is given as bounds: the layer's max over the largest limit, and over "
                    "the smallest.", ""]
        frame = _scale_rows(entry, measured)
        if not frame.empty:
            where = "the K/V range pass on the scoring text" if measured else "no K/V range pass ran"
            out += [f"Scales per layer next to the measured ranges ({where}):", "",
                    long_table(frame, f"{len(frame)} layers: scales and ranges"), ""]
    return "\n".join(out).rstrip() + "\n"
