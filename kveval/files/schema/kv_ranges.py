"""kv_ranges.json: `KvRanges` and its parts (`KvRangesModel`), the measured K/V ranges."""
from __future__ import annotations

from typing import Any, Optional

from pydantic import ConfigDict, model_validator

from kveval.files.schema.base import FileModel, KV_RANGES_VERSION, Number, _missing


# --- kv_ranges.json (worker/kv_ranges.py; run/diagnosis.py writes {"error": ...} on failure) ------

class KvRangesModel(FileModel):
    """Base of every part of kv_ranges.json: a key this kveval does not declare is refused (module doc)."""

    model_config = ConfigDict(extra="forbid")


class TensorRange(KvRangesModel):
    """worker/kv_ranges._Accumulator.result: one tensor's |values| in one layer."""

    count: int
    absmax: Number
    scale: Number
    nonfinite: int
    limits: dict[str, Number]
    over: dict[str, int]
    mean_abs: Optional[Number] = None          # None when nothing was counted
    p50: Optional[Number] = None               # quantiles of the sample; None when nothing was sampled
    p99: Optional[Number] = None
    p99_9: Optional[Number] = None
    p99_99: Optional[Number] = None
    sampled: Optional[bool] = None
    sample_size: Optional[int] = None
    absmax_per_head: Optional[list[Number]] = None


class LayerRange(KvRangesModel):
    layer: int
    attention_type: Optional[str]
    k: TensorRange
    v: TensorRange
    q: Optional[TensorRange] = None            # the query, where it was measured (FlashAttention-3 quantises it)


class KvRanges(KvRangesModel):
    """A light model: either the measured ranges or, when the pass failed, only `error`."""

    schema_version: int = KV_RANGES_VERSION
    error: Optional[str] = None
    model: Optional[dict[str, Any]] = None
    measurement: Optional[dict[str, Any]] = None
    scales: Optional[dict[str, Any]] = None
    limits_at_scale_1: Optional[dict[str, Number]] = None
    layers: Optional[list[LayerRange]] = None
    notes: Optional[list[str]] = None

    @model_validator(mode="after")
    def _measured_unless_error(self) -> KvRanges:
        if self.error is None:
            for name in ("model", "measurement", "layers"):
                if name not in self.model_fields_set:
                    raise _missing(name, "a kv_ranges.json without an error holds the measurement")
        return self
