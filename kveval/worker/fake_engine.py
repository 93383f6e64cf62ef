"""A stand-in for `worker/engine.py` with the same surface and no vLLM: the test double for the
orchestration and verdict paths (issue 17). A cell runs it when its environment has
KVEVAL_ENGINE=fake; nothing else in kveval knows it exists.

It is a deterministic toy, not a model. What it keeps true to vLLM is what kveval's logic depends on:
- the KV pool: bytes per token from the model's config (2 bytes per value in the model dtype, 1 in
  FP8, kept layers in the model dtype), `kv_cache_memory_bytes` (default: 1 GiB at gpu_memory_utilization 0.9,
  scaled by the share given, plus `cpu_offload_gb`), 16-token blocks; a
  max_model_len that does not fit is refused with vLLM's own kv_capacity words;
- greedy generation: the same prompt gives the same tokens; an FP8 cell's answer leaves auto's at a
  point set by its damage;
- teacher-forced scoring: per position a top-k distribution; FP8 adds logit noise whose scale is the
  damage, so KL grows with it.

Damage, from KVEVAL_FAKE_DAMAGE (JSON; default `{}`): `{"fp8_noise": 0.15, "layers": {"3": 0.6}}`. An
FP8 cell's logit noise is `fp8_noise` plus the entries of `layers` that the cell does not keep, so
keeping the damaged layers heals it, as a working `kv_cache_dtype_skip_layers` does.
`"scales_heal": ["tensor"]`: a checkpoint calibrated with that strategy (its config's kv_cache_scheme;
worker/fake_calibrate.py writes one) loses the `layers` noise too; `"head_scales_refused": "..."`: a
per-head calibrated checkpoint does not start, with those words.
`"loops": {"auto": 0.08, "fp8": 0.2}`: the share of prompts whose greedy answer falls into a loop, per
KV dtype (auto's rate for a cell not named); each prompt draws once per dtype, so some loop in both.
The spec is kveval's own test format (`Damage`): a key it does not know is an error, not ignored.

The model's config.json is read for the few fields the toy needs (`_Config`), as the file gives them:
not through inputs/model_config.model_facts, which loads transformers' AutoConfig and reports the
dtype vLLM would cache in, where the fake reports the config's own `torch_dtype`.
"""
from __future__ import annotations

import functools
import hashlib
import math
import os
import time
from pathlib import Path
from typing import Any, Callable, Optional

from pydantic import BaseModel, ConfigDict

from kveval.worker.batching import submit_in_batches
from kveval.worker.engine_settings import EngineSettings as BaseEngineSettings

_BLOCK = 16
_MAX_NUM_SEQS = 256         # vLLM's default for the LLM class on a CPU
_DEFAULT_KV_BYTES = 1 << 30
_DEFAULT_UTILIZATION = 0.9   # vLLM's gpu_memory_utilization default
_FIRST_TOKEN = 200          # generated tokens come from ordinary vocabulary, clear of special tokens
_SPAN = 4000
_ANSWER_TOKENS_PER_UNIT_NOISE = 40   # an FP8 answer follows auto's for about this many tokens / noise


class _Offload(BaseModel):
    """The one vLLM argument among the cell's others that the toy's pool depends on."""

    model_config = ConfigDict(extra="ignore")
    cpu_offload_gb: float = 0.0


def _kv_budget(settings: "EngineSettings") -> int:
    """The pool's bytes: `kv_cache_memory_bytes` when given (an emulated budget); else a toy device whose KV
    share is 1 GiB at vLLM's default gpu_memory_utilization (0.9), scaled by the share asked, plus the bytes
    of weights `cpu_offload_gb` moves to host memory (a physical budget, issue 39's offload reference)."""
    if settings.kv_cache_memory_bytes:
        return settings.kv_cache_memory_bytes
    share = settings.gpu_memory_utilization or _DEFAULT_UTILIZATION
    offloaded = _Offload.model_validate(settings.extra).cpu_offload_gb
    return int(_DEFAULT_KV_BYTES * share / _DEFAULT_UTILIZATION + offloaded * 2 ** 30)


class EngineSettings(BaseEngineSettings):
    """worker/engine_settings.EngineSettings, marked as the fake's in the cell file."""

    def llm_kwargs(self) -> dict[str, Any]:
        return {**super().llm_kwargs(), "engine": "fake"}


class _Loops(BaseModel):
    """Share of prompts whose greedy answer loops, per KV dtype."""

    model_config = ConfigDict(extra="forbid")

    auto: float = 0.0
    fp8: Optional[float] = None    # None: auto's rate

    def rate(self, kind: str) -> float:
        return self.fp8 if kind == "fp8" and self.fp8 is not None else self.auto


class Damage(BaseModel):
    """KVEVAL_FAKE_DAMAGE: how far an FP8 cell drifts, and where answers loop (see the module doc)."""

    model_config = ConfigDict(extra="forbid")

    fp8_noise: float = 0.15
    layers: Optional[dict[str, float]] = None   # layer index -> extra noise unless the cell keeps the layer
    loops: Optional[_Loops] = None
    # Range damage that calibrated scales cure: a checkpoint whose kv_cache_scheme has one of these
    # strategies ("tensor", "attn_head") loses the `layers` noise, as scales fitted to the range would.
    scales_heal: list[str] = []
    # vLLM's words when it refuses per-head scales (off Flash Attention): start-up fails with them.
    head_scales_refused: Optional[str] = None

    @classmethod
    def from_env(cls) -> "Damage":
        return cls.model_validate_json(os.environ.get("KVEVAL_FAKE_DAMAGE") or "{}")


class _Config(BaseModel):
    """The fields of the model's config.json the fake reads (transformers' names), as the file gives them."""

    model_config = ConfigDict(extra="ignore", protected_namespaces=())

    num_hidden_layers: Optional[int] = None
    num_key_value_heads: Optional[int] = None
    num_attention_heads: Optional[int] = None
    head_dim: Optional[int] = None
    hidden_size: Optional[int] = None
    max_position_embeddings: Optional[int] = None
    torch_dtype: Any = None
    quantization_config: Optional[dict[str, Any]] = None

    @property
    def kv_scale_strategy(self) -> str | None:
        """The checkpoint's calibrated K/V scale strategy (compressed-tensors kv_cache_scheme), if any."""
        scheme = (self.quantization_config or {}).get("kv_cache_scheme")
        return scheme.get("strategy") if isinstance(scheme, dict) else None


def vllm_version() -> str:
    return "fake"


def platform_facts() -> dict[str, Any]:
    """As engine.platform_facts, for a cell that did not start: the fake names no device."""
    return {"platform": "fake"}


def _unit(*parts: Any) -> float:
    """A deterministic number in [0, 1) from its arguments."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2 ** 64


def _normal(*parts: Any) -> float:
    u1, u2 = max(_unit("a", *parts), 1e-12), _unit("b", *parts)
    return math.sqrt(-2 * math.log(u1)) * math.cos(2 * math.pi * u2)


# Scoring's draws that depend on the context alone, not on the cell: an `auto` cell scores every sequence
# twice (batched, then one at a time for the noise floor), so the second pass finds them here. The hashes
# are most of a fake cell's CPU time; cached, the numbers are the same. (One short-lived process per cell.)
@functools.lru_cache(maxsize=None)
def _other_tokens(context: tuple, count: int) -> tuple[int, ...]:
    return tuple(_FIRST_TOKEN + int(_unit(context, j) * _SPAN) for j in range(count))


@functools.lru_cache(maxsize=None)
def _clean_logit(context: tuple, token: int) -> float:
    return 2.5 * _normal(context, token)


class Engine:
    def __init__(self, settings: EngineSettings, config: _Config, damage: Damage):
        self.settings = settings
        self.startup_seconds = 0.0
        self._config = config
        layers = config.num_hidden_layers or 1
        kept = {str(k) for k in settings.kv_cache_dtype_skip_layers}
        fp8 = settings.kv_cache_dtype.startswith("fp8")
        healed = config.kv_scale_strategy in damage.scales_heal
        self.noise = 0.0 if not fp8 else damage.fp8_noise + sum(
            v for layer, v in (damage.layers or {}).items() if layer not in kept and not healed)
        heads = config.num_key_value_heads or config.num_attention_heads or 1
        hidden = 64 if config.hidden_size is None else config.hidden_size
        attention_heads = 1 if config.num_attention_heads is None else config.num_attention_heads
        head_dim = config.head_dim or hidden // attention_heads
        kept_layers = sum(1 for k in kept if k.isdigit() and int(k) < layers)
        per_layer = 2 * heads * head_dim
        self.bytes_per_token = per_layer * ((layers - kept_layers) * (1 if fp8 else 2) + kept_layers * 2) if fp8 \
            else per_layer * layers * 2
        kind = "fp8" if fp8 else "auto"
        self.loop_rate = (damage.loops or _Loops()).rate(kind)
        self._loop_kind = kind
        self.kv_budget = _kv_budget(settings)
        self.pool_tokens = self.kv_budget // self.bytes_per_token // _BLOCK * _BLOCK

    @classmethod
    def start(cls, settings: EngineSettings) -> "Engine":
        began = time.perf_counter()
        config = _Config.model_validate_json((Path(settings.model) / "config.json").read_text())
        limit = config.max_position_embeddings or 1 << 20
        if settings.max_model_len > limit:
            raise ValueError(f"User-specified max_model_len ({settings.max_model_len}) is greater than the derived "
                             f"max_model_len (max_position_embeddings={limit} in model's config.json).")
        damage = Damage.from_env()
        if damage.head_scales_refused and config.kv_scale_strategy == "attn_head" \
                and settings.kv_cache_dtype.startswith("fp8"):
            raise ValueError(damage.head_scales_refused)
        engine = cls(settings, config, damage)
        if engine.pool_tokens < settings.max_model_len:
            need = settings.max_model_len * engine.bytes_per_token / 2 ** 30
            have = engine.kv_budget / 2 ** 30
            raise ValueError(f"To serve at least one request with the models's max seq len ({settings.max_model_len}), "
                             f"({need:.2f} GiB KV cache is needed, which is larger than the available KV cache memory "
                             f"({have:.2f} GiB). Based on the available memory, the estimated maximum model length is "
                             f"{engine.pool_tokens}.")
        print(f"fake engine: KV cache dtype {settings.kv_cache_dtype}, pool {engine.pool_tokens} tokens, "
              f"logit noise {engine.noise:g}", flush=True)
        engine.startup_seconds = time.perf_counter() - began
        return engine

    # -- what the engine holds -------------------------------------------------------------
    def capacity(self) -> dict[str, Any]:
        return {"kv_pool_tokens": int(self.pool_tokens), "kv_pool_tokens_source": "fake engine",
                "max_concurrency": self.pool_tokens / self.settings.max_model_len,
                "num_blocks": int(self.pool_tokens // _BLOCK), "block_size": _BLOCK,
                "cache_dtype": self.settings.kv_cache_dtype, "max_num_batched_tokens": None,
                "hybrid_kv_cache_manager": None,
                "max_num_seqs": int(self.settings.extra.get("max_num_seqs", _MAX_NUM_SEQS))}

    def info(self) -> dict[str, Any]:
        return {"vllm_version": "fake", "platform": "fake", "attention_backend": "FAKE",
                "model_dtype": str(self._config.torch_dtype or "bfloat16"),
                "model_max_model_len": self._config.max_position_embeddings}

    # -- running prompts ---------------------------------------------------------------------
    def _refusal(self, n_tokens: int, max_tokens: int) -> dict[str, Any] | None:
        if n_tokens + max_tokens <= self.settings.max_model_len:
            return None
        text = (f"VLLMValidationError: This model's maximum context length is {self.settings.max_model_len} tokens. "
                f"However, you requested {max_tokens} output tokens and your prompt contains {n_tokens} input tokens")
        return {"accepted": False, "rejection": text, "error": None}

    def _answer(self, token_ids: list[int], max_tokens: int) -> list[int]:
        """auto's answer is a function of the prompt; an FP8 answer follows it, then drifts."""
        key = hashlib.blake2b(bytes(str(token_ids[-64:]), "ascii"), digest_size=8).hexdigest()
        follow = max_tokens if self.noise == 0 else int(_ANSWER_TOKENS_PER_UNIT_NOISE / self.noise * (0.5 + _unit(key)))
        out = []
        for step in range(max_tokens):
            salt = "auto" if step < follow else self.settings.kv_cache_dtype
            out.append(_FIRST_TOKEN + int(_unit(key, step, salt) * _SPAN))
        if self.loop_rate and _unit(key, "loop", self._loop_kind) < self.loop_rate and max_tokens >= 16:
            # A loop that replaces the answer early: a three-token cycle from a quarter of the way in.
            start = max_tokens // 4
            cycle = out[start:start + 3]
            out = out[:start] + [cycle[i % 3] for i in range(max_tokens - start)]
        return out

    def generate(self, token_ids: list[int], max_tokens: int, *, ignore_eos: bool = False,
                 stop: list[str] | None = None) -> dict[str, Any]:
        refused = self._refusal(len(token_ids), max_tokens)
        if refused:
            return refused
        answer = self._answer(list(token_ids), max_tokens)
        wall = 1e-4 * (len(token_ids) + len(answer))
        return {"accepted": True, "rejection": None, "error": None, "text": " ".join(f"w{t}" for t in answer),
                "token_ids": answer, "finish_reason": "length", "prompt_tokens": len(token_ids),
                "output_tokens": len(answer), "wall_seconds": wall,
                "timing": {"ttft_s": 1e-4 * len(token_ids), "decode_tok_s": 1e4, "itl_s": 1e-4, "queue_s": 0.0,
                           "generation_tokens": len(answer), "preemptions": 0, "source": "fake engine"}}

    def generate_batch(self, requests: list[tuple[list[int], int, list[str] | None]], *,
                       on_finished: Callable[[int], None] | None = None) -> list[dict[str, Any]]:
        """As vLLM: a batch with one refused prompt is refused whole (worker/batching.py finds it);
        `on_finished(1)` as each request of an accepted batch finishes."""
        def run_batch(batch):
            results = [self.generate(ids, max_tokens, stop=stop) for ids, max_tokens, stop in batch]
            if not all(result["accepted"] for result in results):
                raise ValueError("a prompt of the batch was refused")
            for _ in results:
                if on_finished:
                    on_finished(1)
            return results

        return submit_in_batches(requests, run_batch, lambda r: self.generate(r[0], r[1], stop=r[2]),
                                 lambda r: len(r[0]) + r[1] > self.settings.max_model_len)

    def generate_concurrent(self, token_ids: list[int], max_tokens: int, concurrency: int) -> dict[str, Any]:
        one = self.generate(token_ids, max_tokens, ignore_eos=True)
        if not one["accepted"]:
            return {"accepted": False, "error": one["rejection"] or one["error"]}
        return {"accepted": True, "error": None, "wall_seconds": one["wall_seconds"] * max(1, concurrency / 8),
                "requests": [{"output_tokens": max_tokens, **one["timing"]} for _ in range(concurrency)]}

    def preemptions_total(self) -> int | None:
        return 0

    def score(self, sequences: list[list[int]], top_k: int, *, batched: bool = True) -> list[dict[str, Any]]:
        def run_one(ids):
            refused = self._refusal(len(ids), 0) if len(ids) >= self.settings.max_model_len else None
            return refused or {"accepted": True, "rejection": None, "error": None,
                               "positions": [self._position(ids, i, top_k, batched) for i in range(1, len(ids))]}

        def run_batch(batch):
            if any(len(ids) >= self.settings.max_model_len for ids in batch):
                raise ValueError("a sequence of the batch was refused")
            return [run_one(ids) for ids in batch]

        if not batched:
            return [run_one(ids) for ids in sequences]
        return submit_in_batches(sequences, run_batch, run_one, lambda ids: len(ids) >= self.settings.max_model_len)

    def _position(self, ids: list[int], i: int, top_k: int, batched: bool) -> dict[str, Any]:
        """The distribution over the next token after ids[:i]: the actual token and top_k others."""
        context = tuple(ids[max(0, i - 3):i])
        candidates = list(dict.fromkeys((ids[i],) + _other_tokens(context, top_k + 4)))
        noise = self.noise + (0.0 if batched else 1e-3)  # another batch: the tiny noise of batch composition
        salt = (self.settings.kv_cache_dtype, not batched)
        # No noise (auto, batched): the noise term would add 0.0, so its draws are skipped.
        logits = [_clean_logit(context, c) + noise * _normal(salt, i, c) if noise else _clean_logit(context, c)
                  for c in candidates]
        top = max(logits)
        log_norm = top + math.log(sum(math.exp(x - top) for x in logits) + math.exp(-2.0 - top))  # + the rest
        ranked = sorted(zip(candidates, logits), key=lambda item: -item[1])[:top_k]
        return {"token": ids[i], "logprob": logits[0] - log_norm,
                "top": [[int(token), float(logit - log_norm)] for token, logit in ranked]}
