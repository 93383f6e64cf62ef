"""KV-cache configurations as the user names them: a vLLM kv_cache_dtype, optionally with layers kept
in the model dtype (vLLM's `kv_cache_dtype_skip_layers`, from 0.26) and with calibrated scales:

    fp8                      every attention layer's cache in FP8, at the checkpoint's scales (1.0 without)
    fp8:keep=0,1             layers 0 and 1 keep the model dtype, the rest FP8
    fp8:keep=sliding_window  vLLM's attention-type names work too
    fp8:scaled               per-tensor Q/K/V scales calibrated on kveval's corpus (llm-compressor)
    fp8:scaled=head          per-attention-head scales (vLLM reads them on the Flash Attention backend)
    fp8:scaled,keep=0        both

The spec text is the cell's KV name everywhere (cell ids, tables, the review), so a cell is what
its id says.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

_DTYPE = re.compile(r"^[A-Za-z0-9_]+$")
ATTENTION_TYPES = ("sliding_window",)  # the names vLLM 0.26-0.32 match in kv_cache_dtype_skip_layers


# Names vLLM gives one cache: every vLLM kernel (CUDA, ROCm, CPU) reads "fp8" as e4m3 (csrc's
# Fp8KVCacheDataType: "fp8" and "fp8_e4m3" -> kFp8E4M3), so the two spellings are one configuration.
SAME_CACHE = {"fp8_e4m3": "fp8"}


class KVSpecError(ValueError):
    """A --kv value that is not a KV-cache configuration."""


SCALE_STRATEGIES = {"tensor": "tensor", "head": "attn_head"}   # spec word -> llm-compressor's strategy


@dataclass(frozen=True)
class KVSpec:
    dtype: str
    keep: tuple[str, ...] = ()
    scaled: str | None = None    # None: the checkpoint's own scales; "tensor" / "head": calibrated by kveval

    @property
    def text(self) -> str:
        options = []
        if self.scaled:
            options.append("scaled" if self.scaled == "tensor" else f"scaled={self.scaled}")
        if self.keep:
            options.append(f"keep={','.join(self.keep)}")
        return f"{self.dtype}:{','.join(options)}" if options else self.dtype

    @property
    def cache(self) -> "KVSpec":
        """The configuration vLLM runs for this spec, under one spelling (fp8_e4m3 -> fp8)."""
        return KVSpec(SAME_CACHE.get(self.dtype, self.dtype), self.keep, self.scaled)

    def engine_settings(self) -> dict:
        """What vLLM is given for this spec."""
        settings = {"kv_cache_dtype": self.dtype}
        if self.keep:
            settings["kv_cache_dtype_skip_layers"] = list(self.keep)
        return settings

    def vllm_flags(self) -> str:
        """The same configuration as vLLM's own command-line flags."""
        flags = f"--kv-cache-dtype {self.dtype}"
        return flags + (" --kv-cache-dtype-skip-layers " + " ".join(self.keep) if self.keep else "")

    def label(self, model_dtype: str = "the model dtype") -> str:
        """Words for the review: "FP8 with layers 0, 1 kept in bf16"."""
        name = self.dtype.upper() if self.dtype.startswith("fp8") else f"`{self.dtype}`"
        if self.scaled:
            name += " with calibrated " + ("per-head" if self.scaled == "head" else "per-tensor") + " scales"
        if not self.keep:
            return name
        layers = [k for k in self.keep if k.isdigit()]
        kinds = [k for k in self.keep if not k.isdigit()]
        parts = []
        if layers:
            parts.append(("layer " if len(layers) == 1 else "layers ") + ", ".join(layers))
        parts += [f"{k} layers" for k in kinds]
        return f"{name}{',' if self.scaled else ' with'} {' and '.join(parts)} kept in {model_dtype}"


def parse_kv(text: str) -> KVSpec:
    """'fp8:scaled,keep=0,1' -> KVSpec('fp8', ('0', '1'), 'tensor'); a clear error for anything else."""
    raw = str(text).strip()
    dtype, sep, rest = raw.partition(":")
    dtype = dtype.lower()  # vLLM's names are lower case: FP8 and fp8 are one configuration
    if not _DTYPE.match(dtype):
        raise KVSpecError(f"--kv {raw!r}: {dtype!r} is not a KV-cache dtype name (e.g. auto, fp8, fp8_e4m3, fp8_e5m2)")
    if not sep:
        return KVSpec(dtype)
    keep: list[str] | None = None
    scaled: str | None = None
    for item in (part.strip() for part in rest.split(",")):
        key, eq, value = item.partition("=")
        key = key.strip().lower()
        if key == "keep" and eq:
            keep = [] if keep is None else keep
            item = value.strip()
        elif key == "scaled":
            word = value.strip().lower() if eq else "tensor"
            if word not in SCALE_STRATEGIES:
                raise KVSpecError(f"--kv {raw!r}: scaled= takes {' or '.join(SCALE_STRATEGIES)} (e.g. fp8:scaled=head)")
            scaled = word
            continue
        elif keep is None:
            raise KVSpecError(f"--kv {raw!r}: after ':' kveval knows keep=LAYERS and scaled[=head] "
                              "(e.g. fp8:keep=0,1, fp8:scaled,keep=0)")
        if item:
            keep.append(item)
    if keep is not None and not keep:
        raise KVSpecError(f"--kv {raw!r}: keep= needs at least one layer index or attention type (e.g. fp8:keep=0)")
    keep = keep or []
    bad = [item for item in keep if not (item.isdigit() or item in ATTENTION_TYPES)]
    if bad:
        raise KVSpecError(f"--kv {raw!r}: {', '.join(bad)} is not a layer index or an attention type vLLM knows "
                          f"({', '.join(ATTENTION_TYPES)})")
    if dtype == "auto":
        what = "keep=" if keep else "scaled"
        raise KVSpecError(f"--kv {raw!r}: {what} applies to a quantized cache (e.g. fp8:{what}{'0' if keep else ''}); "
                          "auto is the baseline")
    if scaled and dtype not in ("fp8", "fp8_e4m3"):
        # llm-compressor's FP8 scales are for e4m3 (limit 448); e5m2's range is another.
        raise KVSpecError(f"--kv {raw!r}: scaled applies to an e4m3 FP8 cache (fp8 or fp8_e4m3, e.g. fp8:scaled)")
    numbers = sorted({int(k) for k in keep if k.isdigit()})  # "07" and "7" are one layer
    names = sorted({k for k in keep if not k.isdigit()})
    return KVSpec(dtype, tuple(str(n) for n in numbers) + tuple(names), scaled)


def keep_spec(dtype: str, layers) -> KVSpec:
    return KVSpec(dtype, tuple(str(n) for n in sorted({int(x) for x in layers})))
