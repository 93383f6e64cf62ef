"""Per-layer KV range against the FP8 range: which layers' K or V an FP8 cache would clip.

vLLM quantises K and V per layer with one scale each: a value x is stored as fp8(x / scale), and
the conversion saturates, so every |x| above FP8_MAX × scale is clipped. Without checkpoint scales
vLLM uses scale 1.0 (limit ±448 for e4m3). Input is kv_ranges.json as the typed `schema.KvRanges` (what
`kveval.worker.kv_ranges.measure_kv_ranges` returns, measured with transformers on real text; a plain dict
is validated once, in `diagnose`); everything here is pure: no torch, no I/O.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any, Mapping, Union

import numpy as np
import pandas as pd

from kveval.files import schema

FP8_MAX = {"fp8": 448.0, "fp8_e4m3": 448.0, "fp8_e5m2": 57344.0}
# The key under which kv_ranges records exact counts for each FP8 flavour.
_CANONICAL = {"fp8": "fp8_e4m3", "fp8_e4m3": "fp8_e4m3", "fp8_e5m2": "fp8_e5m2"}
_QUANTILES = (("p50", 0.5), ("p99", 0.99), ("p99_9", 0.999), ("p99_99", 0.9999))
TENSORS = ("k", "v")
UNCALIBRATED_NOTE = "no KV scales in the checkpoint: vLLM runs the FP8 cache at scale 1.0"


def fp8_max(kv_cache_dtype: str | None) -> float | None:
    """Largest finite value of the cache's FP8 format; None for a cache that is not FP8 ("auto",
    "bfloat16", ...), which has no range limit worth diagnosing."""
    if kv_cache_dtype is None:
        return None
    return FP8_MAX.get(str(kv_cache_dtype).lower())


def canonical_fp8(kv_cache_dtype: str) -> str | None:
    """"fp8" is e4m3 in vLLM; the exact counts are stored under the explicit names."""
    return _CANONICAL.get(str(kv_cache_dtype).lower())


ScalesGiven = Union[schema.KvScales, Mapping[str, Any], None]   # the manifest's KvScales, or read_kv_scales' dict


def _given_scales(scales: ScalesGiven, tensor: str) -> Mapping[Any, Any]:
    if isinstance(scales, schema.KvScales):
        return scales.k_scale if tensor == "k" else scales.v_scale
    return (scales or {}).get(f"{tensor}_scale") or {}


def normalise_scales(scales: ScalesGiven) -> dict[str, dict[int, float]]:
    """{"k": {layer: scale}, "v": {...}} from the manifest's `KvScales` or a read_kv_scales-style dict
    ({"k_scale": {...}}) whose layer keys may be JSON strings. Missing layers mean scale 1.0 (what vLLM
    uses then)."""
    out: dict[str, dict[int, float]] = {"k": {}, "v": {}}
    for tensor in TENSORS:
        given = _given_scales(scales, tensor)
        for layer, value in given.items():
            if value is None:
                continue
            value = float(value)
            if not math.isfinite(value) or value <= 0:
                raise ValueError(f"{tensor}_scale of layer {layer} must be a positive number, got {value}")
            out[tensor][int(layer)] = value
    return out


def _scale_note(scales: ScalesGiven, normalised: dict[str, dict[int, float]]) -> tuple[bool, str]:
    if isinstance(scales, schema.KvScales):
        calibrated, source = scales.calibrated, scales.source
    else:
        if scales is not None and "calibrated" in scales:
            calibrated = bool(scales["calibrated"])
        else:
            calibrated = any(v != 1.0 for table in normalised.values() for v in table.values())
        source = (scales or {}).get("source")
    if not calibrated:
        return False, UNCALIBRATED_NOTE
    return True, f"calibrated: per-layer k/v scales from the checkpoint ({source or 'given scales'})"


def _share_estimate(stats: schema.TensorRange, limit: float, count: int) -> float:
    """Upper bound on the share over `limit` from the stored quantiles, used only when the exact
    count was made against a different limit (the scales changed after measuring)."""
    bound = 1.0
    for key, level in _QUANTILES:
        value = getattr(stats, key)
        if value is not None and value <= limit:
            bound = 1.0 - level
    # At least one value (the absmax) is over the limit when we get here.
    return max(bound, 1.0 / max(count, 1))


@dataclass(frozen=True)
class RangeRow:
    """One layer's K, V (or Q) against its FP8 limit: a row of the diagnosis (schema.RangeRow), fields in
    TABLE_COLUMNS order. limit, ratio, over and share_over are None where the dtype is not FP8."""

    layer: int
    attention_type: str | None
    tensor: str
    count: int
    absmax: float | None
    p99_9: float | None
    p99_99: float | None
    scale: float
    limit: float | None = None
    ratio: float | None = None
    over: int | None = None
    share_over: float | None = None
    share_exact: bool = True
    saturates: bool = False
    nonfinite: int = 0


def _row(layer: schema.LayerRange, tensor: str, stats: schema.TensorRange, maximum: float | None,
         canonical: str | None, scale: float) -> RangeRow:
    absmax, count = stats.absmax, stats.count
    unlimited = RangeRow(layer=layer.layer, attention_type=layer.attention_type, tensor=tensor, count=count,
                         absmax=absmax, p99_9=stats.p99_9, p99_99=stats.p99_99, scale=scale,
                         nonfinite=stats.nonfinite)
    if maximum is None or absmax is None or canonical is None:
        return unlimited
    limit = maximum * scale
    measured_limit = stats.limits.get(canonical)
    over = stats.over.get(canonical)
    if over is not None and measured_limit is not None and math.isclose(measured_limit, limit, rel_tol=1e-6):
        return replace(unlimited, limit=limit, ratio=absmax / limit, over=int(over),
                       share_over=over / count if count else 0.0, saturates=over > 0)
    # Counted against another scale: absmax still decides exactly whether anything clips.
    saturates = absmax > limit or stats.nonfinite > 0
    return replace(unlimited, limit=limit, ratio=absmax / limit, saturates=saturates, share_exact=not saturates,
                   share_over=_share_estimate(stats, limit, count) if saturates else 0.0)


def _fields(row: RangeRow, names: tuple[str, ...]) -> dict[str, Any]:
    return {name: getattr(row, name) for name in names}


_OFFENDING_FIELDS = ("layer", "tensor", "absmax", "p99_9", "limit", "ratio", "share_over", "share_exact")
_WORST_FIELDS = ("layer", "tensor", "absmax", "limit", "ratio")


def _largest(rows: list[RangeRow], tensor: str) -> dict[str, Any] | None:
    mine = [r for r in rows if r.tensor == tensor and r.absmax is not None]
    if not mine:
        return None
    top = max(mine, key=lambda r: (r.ratio if r.ratio is not None else r.absmax or 0.0))
    headroom = top.limit / top.absmax if top.limit and top.absmax else None
    return {"layer": top.layer, "absmax": top.absmax, "limit": top.limit, "ratio": top.ratio, "headroom": headroom}


def diagnose(ranges: schema.KvRanges | dict[str, Any], kv_cache_dtype: str = "fp8",
             scales: ScalesGiven = None) -> dict[str, Any]:
    """Compare every layer's measured |K| and |V| with the FP8 limit (FP8 max × that layer's scale).

    `scales` (the manifest's `KvScales`, or read_kv_scales' dict) defaults to the scales the ranges were measured against, so the
    over-limit counts are exact; with other scales, saturation is still exact (absmax > limit) but
    the share over the limit is an upper bound from the stored quantiles (`share_exact` False).
    The result is the evidence's diagnosis (`schema.Diagnosis`) as a dict.
    """
    if isinstance(ranges, dict):
        ranges = schema.parse(schema.KvRanges, ranges, "the K/V ranges")
    maximum, canonical = fp8_max(kv_cache_dtype), canonical_fp8(kv_cache_dtype)
    if scales is None:
        scales = ranges.scales or {}
    normalised = normalise_scales(scales)
    calibrated, note = _scale_note(scales, normalised)
    measurement = ranges.measurement or {}  # open: which device, how long, the library versions
    head = {"kv_cache_dtype": kv_cache_dtype, "fp8_max": maximum, "calibrated": calibrated, "scale_note": note,
            "tokens": measurement.get("tokens"), "documents": measurement.get("documents_used"),
            "model": ranges.model or {}}
    if ranges.error:
        return {**head, "rows": [], "offending_layers": [], "offending": [], "worst_ratio": None, "worst": None,
                "largest": {"k": None, "v": None}, "error": str(ranges.error)}
    rows = []
    for layer in sorted(ranges.layers or [], key=lambda entry: entry.layer):
        for tensor in TENSORS:
            stats = getattr(layer, tensor)
            if stats:
                scale = normalised[tensor].get(layer.layer, 1.0)
                rows.append(_row(layer, tensor, stats, maximum, canonical, scale))
    bad = [r for r in rows if r.saturates]
    bad.sort(key=lambda r: (-(r.share_over or 0.0), -(r.ratio or 0.0), r.layer, r.tensor))
    rated = [r for r in rows if r.ratio is not None]
    worst = max(rated, key=lambda r: r.ratio or 0.0) if rated else None
    return {**head, "rows": [asdict(r) for r in rows], "offending_layers": sorted({r.layer for r in bad}),
            "offending": [_fields(r, _OFFENDING_FIELDS) for r in bad],
            "worst_ratio": worst.ratio if worst else None, "worst": _fields(worst, _WORST_FIELDS) if worst else None,
            "largest": {tensor: _largest(rows, tensor) for tensor in TENSORS},
            **({"note": f"kv_cache_dtype {kv_cache_dtype!r} is not FP8: no range limit applies"}
               if maximum is None else {}),
            "outlier_layers": outlier_layers(rows), "query": _query_summary(ranges, maximum, canonical)}


def _query_summary(ranges: schema.KvRanges, maximum: float | None, canonical: str | None) -> dict[str, Any] | None:
    """The query's range per layer, where it was measured: vLLM's FlashAttention-3 backend quantises the
    query to FP8 too when the KV cache is FP8 (at q_scale 1.0 unless the checkpoint gives one), so a
    query past the FP8 limit clips there even where K and V fit. Kept apart from the cache's rows: it
    decides nothing about which layers' cache to keep, it explains damage the K/V ranges cannot."""
    measured = sorted(((layer, layer.q) for layer in ranges.layers or [] if layer.q), key=lambda pair: pair[0].layer)
    if not measured:
        return None
    rows = [_row(layer, "q", query, maximum, canonical, 1.0) for layer, query in measured]
    median = float(np.median([r.absmax for r in rows if r.absmax is not None] or [0.0]))
    return {"rows": [asdict(r) for r in rows], "largest": _largest(rows, "q"), "median_absmax": median,
            "over_layers": [r.layer for r in rows if r.saturates]}


OUTLIER_SHARE_OF_LIMIT = 0.25
OUTLIER_OVER_MEDIAN = 4.0


def outlier_layers(rows: list[RangeRow]) -> list[int]:
    """Layers whose K or V reach a quarter of the FP8 limit *and* four times the median layer's peak.

    Such a layer does not clip, but its cache is dominated by a few huge channels (Qwen2's K biases:
    |K| 360 in layer 0 against a median layer's 13): FP8 keeps 3 mantissa bits, so at that magnitude
    the rounding step is 16-32, the largest absolute loss of any layer. They are the next candidates
    to keep in the model dtype when no layer saturates (whether that helps is for the gate to say).
    """
    found: set[int] = set()
    for tensor in TENSORS:
        mine = [(r.layer, r.absmax, r.limit) for r in rows if r.tensor == tensor and r.absmax is not None and r.limit]
        if not mine:
            continue
        median = float(np.median([absmax for _, absmax, _ in mine]))
        found |= {layer for layer, absmax, limit in mine
                  if absmax >= OUTLIER_SHARE_OF_LIMIT * limit and absmax >= OUTLIER_OVER_MEDIAN * median}
    return sorted(found)


def plan_keep_layers(diagnosis: Mapping[str, Any]) -> list[int]:
    """Layers to keep in the model dtype so that no layer left in FP8 clips its K or V.

    Rule: vLLM quantises each layer's cache with its own scale, independently of the others, and a
    layer kept in the model dtype (vLLM's `--kv-cache-dtype-skip-layers`) has no range limit. So a
    layer left in FP8 clips iff its own K or V exceeds its own limit, and the smallest set to keep is
    exactly the offending layers (K or V saturating), sorted. This holds for the measured text only:
    a layer close to its limit (ratio just under 1) is not kept, and may clip on other text.
    """
    if diagnosis.get("error"):
        return []
    return sorted({int(layer) for layer in diagnosis.get("offending_layers") or []})


def keeps_every_layer(diagnosis: schema.Diagnosis, keep: list[int]) -> bool:
    """Whether keeping `keep` in the model dtype keeps every layer of the diagnosed model: the `auto` cache under
    another name, with no capacity to gain (run/remedy.py and run/search.py propose no such set)."""
    layers = diagnosis.model.num_layers or len({row.layer for row in diagnosis.rows})
    return bool(layers) and len(set(keep)) >= layers


def skip_layers_argument(diagnosis: Mapping[str, Any]) -> str | None:
    """The vLLM flag that keeps the planned layers out of the FP8 cache, or None when none need it."""
    keep = plan_keep_layers(diagnosis)
    return None if not keep else "--kv-cache-dtype-skip-layers " + " ".join(str(layer) for layer in keep)


TABLE_COLUMNS = ["layer", "attention_type", "tensor", "count", "absmax", "p99_9", "p99_99", "scale", "limit",
                 "ratio", "over", "share_over", "share_exact", "saturates", "nonfinite"]


def diagnosis_table(diagnosis: Mapping[str, Any] | None) -> pd.DataFrame:
    """One row per layer and tensor (K, V), for the review and its CSV."""
    rows = (diagnosis or {}).get("rows") or []
    return pd.DataFrame(rows, columns=TABLE_COLUMNS)
