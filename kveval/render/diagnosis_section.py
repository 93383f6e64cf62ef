"""The review's section on per-layer KV range: does any layer's K or V leave the FP8 range?

Pure: the evidence's `schema.Diagnosis` (kveval.analysis.kv_range.diagnose) in, markdown lines out.
"""
from __future__ import annotations

import pandas as pd

from kveval.analysis.kv_range import skip_layers_argument
from kveval.files import schema
from kveval.render.markdown import escape_cell, fmt_int, fmt_sig, long_table

HEADING = "## Per-layer KV range vs the FP8 range"
MAX_ROWS = 20


def _share(value) -> str:
    """Shares over the limit are often tiny (0.002 %): significant digits, not a fixed 0.0 %."""
    return "" if value is None or pd.isna(value) else f"{fmt_sig(100 * value, 2)} %"


def _scale_sentence(diagnosis: schema.Diagnosis) -> str:
    dtype = diagnosis.kv_cache_dtype or "fp8"
    if diagnosis.calibrated:
        return (f"The {dtype} cache runs calibrated: each layer's limit is the FP8 maximum "
                f"({fmt_sig(diagnosis.fp8_max)}) times its K or V scale from the checkpoint "
                f"({escape_cell(diagnosis.scale_note)}).")
    return (f"The {dtype} cache runs at scale 1.0 (the checkpoint gives vLLM no K/V scales), so every layer's "
            f"limit is ±{fmt_sig(diagnosis.fp8_max)}.")


def _measured_sentence(diagnosis: schema.Diagnosis) -> str:
    tokens, documents = diagnosis.tokens, diagnosis.documents
    where = f" from {fmt_int(documents)} document{'s' if documents != 1 else ''}" if documents else ""
    return (f"K (after bias, k-norm and rotary embedding) and V were measured exactly as written into the cache, "
            f"with transformers on {fmt_int(tokens) or 'an unknown number of'} tokens{where}.")


def _clean_sentence(diagnosis: schema.Diagnosis) -> str:
    largest = diagnosis.largest.k
    if not largest or not largest.absmax:
        return "No layer's K or V leaves the FP8 range."
    headroom = largest.headroom
    below = f", {headroom:.0f}× below the limit" if headroom and headroom >= 10 else (
        f", {headroom:.2g}× below the limit" if headroom else "")
    v = diagnosis.largest.v
    v_part = f"; largest |V| is {fmt_sig(v.absmax)} in layer {v.layer}" if v and v.absmax else ""
    return (f"No layer's K or V leaves the FP8 range (largest |K| is {fmt_sig(largest.absmax)} in layer "
            f"{largest.layer}{below}{v_part}).")


def _offending_table(diagnosis: schema.Diagnosis) -> str:
    rows = diagnosis.offending
    view = pd.DataFrame({
        "layer": [r.layer for r in rows],
        "tensor": [str(r.tensor).upper() for r in rows],
        "absmax": [fmt_sig(r.absmax) for r in rows],
        "p99.9": [fmt_sig(r.p99_9) for r in rows],
        "limit": [fmt_sig(r.limit) for r in rows],
        "share over": [_share(r.share_over) + ("" if r.share_exact else " (≤, estimated)") for r in rows],
    })
    shown = view.head(MAX_ROWS)
    return long_table(shown, f"{len(shown)} rows: layer and tensor")


def render_diagnosis_section(diagnosis: schema.Diagnosis | schema.DiagnosisFailed | None,
                             plot_file: str | None = None) -> list[str]:
    """Markdown lines: heading, how the cache is scaled, what was measured, then either the clean
    sentence or the offending layers (and which layers to keep out of FP8), and the figure."""
    out = [HEADING, ""]
    if diagnosis is None:
        return out + ["_The per-layer KV range was not measured in this run._"]
    if diagnosis.error:
        return out + [f"The per-layer KV range could not be measured: {escape_cell(diagnosis.error, 400)}"]
    if diagnosis.fp8_max is None:
        return out + [f"The cache dtype {escape_cell(diagnosis.kv_cache_dtype)} is not FP8: "
                      "no range limit applies."]
    out += [_scale_sentence(diagnosis) + " " + _measured_sentence(diagnosis), ""]
    if not diagnosis.rows:
        return out + ["_No layer wrote to the KV cache: nothing to compare._"]
    offending = diagnosis.offending
    if not offending:
        out.append(_clean_sentence(diagnosis))
        outliers = diagnosis.outlier_layers or []
        if outliers:
            out += ["", f"Outlier layer{'s' if len(outliers) > 1 else ''} {', '.join(map(str, outliers))}: their K or V "
                        "peak within 4× of the limit and at least 4× above the median layer. Nothing clips, but FP8 keeps "
                        "3 mantissa bits, so these layers lose the most absolute detail (e.g. a rounding step of 32 "
                        "at |x| 256-448): kveval's next candidates to keep in the model dtype."]
    else:
        layers = diagnosis.offending_layers
        out += [f"**{len(layers)} layer{'s' if len(layers) != 1 else ''} leave{'s' if len(layers) == 1 else ''} "
                f"the FP8 range** — the FP8 cache clips these values:", "", _offending_table(diagnosis)]
        if len(offending) > MAX_ROWS:
            out.append(f"_… and {len(offending) - MAX_ROWS} more rows in the per-layer table._")
        argument = skip_layers_argument(schema.dump(diagnosis))   # analysis.kv_range reads the stored dict
        if argument:
            out += ["", f"Keeping exactly these layers in the model dtype avoids the clipping: `{argument}`."]
    query = _query_sentence(diagnosis)
    if query:
        out += ["", query]
    if plot_file:
        out += ["", f"![per-layer K/V range vs the FP8 limit]({plot_file})"]
    return out


def _query_sentence(diagnosis: schema.Diagnosis) -> str | None:
    """Where the query was measured: vLLM's FlashAttention-3 backend quantises it to FP8 as well."""
    query = diagnosis.query
    largest = query.largest if query else None
    if not largest or not largest.absmax:
        return None
    over = query.over_layers
    clips = (f"it leaves the FP8 range in layer{'s' if len(over) > 1 else ''} {', '.join(map(str, over))}, so "
             f"{'those layers’' if len(over) > 1 else 'its'} attention scores are computed from clipped queries wherever "
             "the backend quantises Q"
             if over else "no layer's query leaves the FP8 range")
    return (f"The query (after the rotary embedding), which vLLM's FlashAttention-3 backend also quantises to FP8 "
            f"when the KV cache is FP8 (at scale 1.0 unless the checkpoint gives a q scale): largest |Q| is "
            f"{fmt_sig(largest.absmax)} in layer {largest.layer} (median layer peak "
            f"{fmt_sig(query.median_absmax)}); {clips}.")
