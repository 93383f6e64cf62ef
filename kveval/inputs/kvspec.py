"""KV-cache configurations as the user names them: a vLLM kv_cache_dtype, optionally with layers kept
in the model dtype (vLLM's `kv_cache_dtype_skip_layers`, from 0.26):

    fp8                      every attention layer's cache in FP8
    fp8:keep=0,1             layers 0 and 1 keep the model dtype, the rest FP8
    fp8:keep=sliding_window  vLLM's attention-type names work too

The spec text is the cell's KV name everywhere (cell ids, tables, the review), so a cell is what
its id says.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

_DTYPE = re.compile(r"^[A-Za-z0-9_]+$")
ATTENTION_TYPES = ("sliding_window",)  # the names vLLM 0.26-0.32 match in kv_cache_dtype_skip_layers


class KVSpecError(ValueError):
    """A --kv value that is not a KV-cache configuration."""


@dataclass(frozen=True)
class KVSpec:
    dtype: str
    keep: tuple[str, ...] = ()

    @property
    def text(self) -> str:
        return f"{self.dtype}:keep={','.join(self.keep)}" if self.keep else self.dtype

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
        if not self.keep:
            return name
        layers = [k for k in self.keep if k.isdigit()]
        kinds = [k for k in self.keep if not k.isdigit()]
        parts = []
        if layers:
            parts.append(("layer " if len(layers) == 1 else "layers ") + ", ".join(layers))
        parts += [f"{k} layers" for k in kinds]
        return f"{name} with {' and '.join(parts)} kept in {model_dtype}"


def parse_kv(text: str) -> KVSpec:
    """'fp8:keep=0,1' -> KVSpec('fp8', ('0', '1')); a clear error for anything else."""
    raw = str(text).strip()
    dtype, sep, rest = raw.partition(":")
    dtype = dtype.lower()  # vLLM's names are lower case: FP8 and fp8 are one configuration
    if not _DTYPE.match(dtype):
        raise KVSpecError(f"--kv {raw!r}: {dtype!r} is not a KV-cache dtype name (e.g. auto, fp8, fp8_e4m3, fp8_e5m2)")
    if not sep:
        return KVSpec(dtype)
    key, eq, items = rest.partition("=")
    if key != "keep" or not eq:
        raise KVSpecError(f"--kv {raw!r}: after ':' kveval knows only keep=LAYERS (e.g. fp8:keep=0,1)")
    keep = [item.strip() for item in items.split(",") if item.strip()]
    if not keep:
        raise KVSpecError(f"--kv {raw!r}: keep= needs at least one layer index or attention type (e.g. fp8:keep=0)")
    bad = [item for item in keep if not (item.isdigit() or item in ATTENTION_TYPES)]
    if bad:
        raise KVSpecError(f"--kv {raw!r}: {', '.join(bad)} is not a layer index or an attention type vLLM knows "
                          f"({', '.join(ATTENTION_TYPES)})")
    if dtype == "auto":
        raise KVSpecError(f"--kv {raw!r}: keep= applies to a quantized cache (e.g. fp8:keep=0); auto is the baseline")
    numbers = sorted({int(k) for k in keep if k.isdigit()})  # "07" and "7" are one layer
    names = sorted({k for k in keep if not k.isdigit()})
    return KVSpec(dtype, tuple(str(n) for n in numbers) + tuple(names))


def keep_spec(dtype: str, layers) -> KVSpec:
    return KVSpec(dtype, tuple(str(n) for n in sorted({int(x) for x in layers})))
