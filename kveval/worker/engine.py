"""One cell's vLLM engine: start it, read its KV pool, generate and score. The one module that imports vLLM.

An `Engine` wraps `vllm.LLM` for one cell: start it with the cell's KV dtype and max_model_len,
read what it holds, and submit prompts in batches (worker/batching.py) so that the scheduler batches
them, while a refused prompt still ends alone and is recorded with vLLM's own message instead of
sinking the batch. Everything returned is plain data (dicts, lists), so the rest of kveval never
touches vLLM objects.
"""
from __future__ import annotations

import os
import re
import time
from typing import Any, Callable

# A cell is already its own process, so run vLLM's engine core in-process: the real start-up
# exception reaches us (instead of "Engine core initialization failed") and no third process is
# spawned. Must be set before vLLM is imported.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

import vllm  # noqa: E402
from vllm import LLM, SamplingParams  # noqa: E402

try:  # moved between releases
    from vllm.inputs import TokensPrompt  # noqa: E402
except ImportError:  # pragma: no cover
    from vllm.inputs.data import TokensPrompt  # type: ignore  # noqa: E402

from kveval.analysis.backend_family import kv_cache_backend  # noqa: E402
from kveval.inputs.device_platform import describe_platform  # noqa: E402
from kveval.worker.batching import submit_in_batches  # noqa: E402
from kveval.worker.request_progress import reporting_bar  # noqa: E402
from kveval.worker.engine_settings import EngineSettings as BaseEngineSettings  # noqa: E402

# The prompt-too-long texts of vLLM 0.26 and 0.32 ("This model's maximum context length is ...").
_TOO_LONG = re.compile(r"maximum context length|prompt .*(too long|longer than)|exceeds this limit", re.I)


class EngineSettings(BaseEngineSettings):
    """The cell's settings; on a GPU a cell that keeps layers also names its attention backend."""

    def llm_kwargs(self) -> dict[str, Any]:
        kwargs = super().llm_kwargs()
        backend = kept_layers_backend() if self.kv_cache_dtype_skip_layers else None
        if backend and "attention_backend" not in self.extra:
            kwargs["attention_backend"] = backend
        return kwargs


# vLLM's FlashAttention backend (0.26; 0.32's source is the same) builds FA3's ahead-of-time schedule
# with the global cache dtype (FlashAttentionMetadataBuilder.build, `qkv_dtype`), so the layers kept in
# the model dtype run with an FP8 schedule: requests fail with "scheduler_metadata must have shape" or
# hang (reports/h200-qwen2.5-coder-1.5b-keep-layers-defect). Triton's backend reads each layer's own
# dtype, so a cell that keeps layers runs on it on a GPU, and the deploy line names it.
KEPT_LAYERS_GPU_BACKEND = "TRITON_ATTN"


def kept_layers_backend() -> str | None:
    """The attention backend a cell with kept layers must run on here; None: the platform's default."""
    from vllm.platforms import current_platform

    return KEPT_LAYERS_GPU_BACKEND if current_platform.is_cuda() else None


def vllm_version() -> str:
    return vllm.__version__


def platform_facts() -> dict[str, Any]:
    """What vLLM's platform layer says about this cell's device: {platform (cuda, rocm, cpu, xpu, ...),
    device_name, device_capability ("9.0"; None on a CPU)} (inputs/device_platform.py)."""
    from vllm.platforms import current_platform

    facts = describe_platform(current_platform)
    return {key: facts[key] for key in ("platform", "device_name", "device_capability")}


class Engine:
    """A started vLLM engine for one cell."""

    def __init__(self, llm: LLM, settings: EngineSettings, startup_seconds: float):
        self.llm = llm
        self.settings = settings
        self.startup_seconds = startup_seconds

    @classmethod
    def start(cls, settings: EngineSettings) -> "Engine":
        """Start vLLM; any exception is left to the caller, who classifies it with the log."""
        began = time.perf_counter()
        llm = LLM(**settings.llm_kwargs())
        return cls(llm, settings, time.perf_counter() - began)

    # -- what the engine holds -------------------------------------------------------------
    def capacity(self) -> dict[str, Any]:
        cache = self.llm.llm_engine.vllm_config.cache_config
        scheduler = self.llm.llm_engine.vllm_config.scheduler_config
        blocks = getattr(cache, "num_gpu_blocks", None)
        block_size = getattr(cache, "block_size", None)
        tokens = getattr(cache, "kv_cache_size_tokens", None)  # vLLM >= 0.24
        source = "cache_config.kv_cache_size_tokens"
        if tokens is None and blocks and block_size:
            tokens, source = blocks * block_size, "num_gpu_blocks x block_size"
        concurrency = getattr(cache, "kv_cache_max_concurrency", None)
        if concurrency is None and tokens:
            concurrency = tokens / self.settings.max_model_len
        return {
            "kv_pool_tokens": int(tokens) if tokens is not None else None,
            "kv_pool_tokens_source": source if tokens is not None else None,
            "max_concurrency": float(concurrency) if concurrency is not None else None,
            "num_blocks": blocks,
            "block_size": block_size,
            "cache_dtype": str(getattr(cache, "cache_dtype", self.settings.kv_cache_dtype)),
            # What a sliding-window layer holds per request depends on these (analysis/capacity_model.py).
            "max_num_batched_tokens": getattr(scheduler, "max_num_batched_tokens", None),
            "hybrid_kv_cache_manager": (None if getattr(scheduler, "disable_hybrid_kv_cache_manager", None) is None
                                        else not scheduler.disable_hybrid_kv_cache_manager),
            # The scheduler's cap on requests at once: no pool size admits more (issue 41).
            "max_num_seqs": getattr(scheduler, "max_num_seqs", None),
        }

    def info(self) -> dict[str, Any]:
        model_config = self.llm.llm_engine.vllm_config.model_config
        return {
            "vllm_version": vllm_version(),
            **platform_facts(),
            "attention_backend": self._attention_backend(),
            "model_dtype": str(getattr(model_config, "dtype", "")).replace("torch.", ""),
            "model_max_model_len": getattr(model_config, "max_model_len", None),
        }

    def _attention_backend(self) -> str | None:
        # Reachable only with the in-process engine core; the log is the fallback (see worker/cell_main.py).
        try:
            runner = self.llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.worker.model_runner
            names = [group.backend.get_name() for groups in runner.attn_groups for group in groups]
        except Exception:  # noqa: BLE001 - internals differ between releases
            return None
        return kv_cache_backend(names)

    # -- running prompts ---------------------------------------------------------------------
    def generate(self, token_ids: list[int], max_tokens: int, *, ignore_eos: bool = False,
                 stop: list[str] | None = None) -> dict[str, Any]:
        """Greedy-generate for one prompt. A refused prompt comes back as `accepted: False`.
        `stop`: strings that end the answer (not included in it), as lm-eval's `until`."""
        params = SamplingParams(
            temperature=0.0, max_tokens=max_tokens, seed=self.settings.seed, ignore_eos=ignore_eos,
            stop=list(stop) if stop else None,
        )
        began = time.perf_counter()
        try:
            outputs = self.llm.generate([TokensPrompt(prompt_token_ids=list(token_ids))], params, use_tqdm=False)
        except Exception as error:  # noqa: BLE001 - vLLM's validation error class moved between releases
            text = f"{type(error).__name__}: {error}"
            if _TOO_LONG.search(str(error)):
                return {"accepted": False, "rejection": text, "error": None}
            return {"accepted": False, "rejection": None, "error": text}
        wall = time.perf_counter() - began
        return _generated(outputs[0], token_ids, wall, wall)


    def generate_batch(self, requests: list[tuple[list[int], int, list[str] | None]], *,
                       on_finished: Callable[[int], None] | None = None) -> list[dict[str, Any]]:
        """Greedy-generate for many prompts in as few vLLM calls as their refusals allow
        (worker/batching.py): accepted prompts run batched, each refused one ends alone with vLLM's words.
        `wall_seconds` is the prompt's share of its batch's wall time. `on_finished(n)`: called as
        requests of a batch finish (n of them), so a slow batch still reports progress."""
        def run_batch(batch):
            params = [SamplingParams(temperature=0.0, max_tokens=max_tokens, seed=self.settings.seed,
                                     stop=list(stop) if stop else None) for _, max_tokens, stop in batch]
            began = time.perf_counter()
            outputs = self.llm.generate([TokensPrompt(prompt_token_ids=list(ids)) for ids, _, _ in batch],
                                        params, use_tqdm=reporting_bar(on_finished) if on_finished else False)
            wall = time.perf_counter() - began
            return [_generated(output, ids, wall / len(batch), wall) for (ids, _, _), output in zip(batch, outputs)]

        # vLLM 0.32 refuses a prompt of max_model_len tokens or more; a longer answer is cut, not refused.
        return submit_in_batches(requests, run_batch, lambda r: self.generate(r[0], r[1], stop=r[2]),
                                 lambda r: len(r[0]) >= self.settings.max_model_len)

    def generate_concurrent(self, token_ids: list[int], max_tokens: int, concurrency: int) -> dict[str, Any]:
        """`concurrency` copies of one prompt submitted at once (vLLM schedules as many together as its
        KV pool and max_num_seqs allow, and queues the rest), each decoding exactly `max_tokens`.
        Returns the wall time and each request's timing; a refusal or error instead of results."""
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, seed=self.settings.seed, ignore_eos=True)
        prompts = [TokensPrompt(prompt_token_ids=list(token_ids)) for _ in range(concurrency)]
        began = time.perf_counter()
        try:
            outputs = self.llm.generate(prompts, params, use_tqdm=False)
        except Exception as error:  # noqa: BLE001 - recorded, the sweep goes on
            return {"accepted": False, "error": f"{type(error).__name__}: {error}"}
        wall = time.perf_counter() - began
        return {"accepted": True, "error": None, "wall_seconds": wall,
                "requests": [{"output_tokens": len(o.outputs[0].token_ids), **_timing(o.metrics, wall)}
                             for o in outputs]}

    def preemptions_total(self) -> int | None:
        """vLLM's count of preempted requests since the engine started (its Prometheus counter
        vllm:num_preemptions; per-request stats have no such count), or None where it cannot be read."""
        try:
            metrics = self.llm.get_metrics()
        except Exception:  # noqa: BLE001 - stats off, or a vLLM without the snapshot API
            return None
        values = [m.value for m in metrics if getattr(m, "name", "").startswith("vllm:num_preemptions")
                  and isinstance(getattr(m, "value", None), (int, float))]
        return int(sum(values)) if values else None

    def score(self, sequences: list[list[int]], top_k: int, *, batched: bool = True) -> list[dict[str, Any]]:
        """Teacher-forced log-probabilities of every position of each sequence (prompt_logprobs).

        Returns, per sequence, `positions[i-1]` for i = 1..len-1: the logprob of token i given
        tokens[:i] and the top-k candidates there. Batched (worker/batching.py) unless
        `batched=False`: one request at a time, the other batch composition the noise floor measures.
        """
        params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=top_k, seed=self.settings.seed)

        def run_batch(batch):
            outputs = self.llm.generate([TokensPrompt(prompt_token_ids=list(ids)) for ids in batch], params,
                                        use_tqdm=False)
            return [_positions(output, top_k) for output in outputs]

        def run_one(ids):
            try:
                output = self.llm.generate([TokensPrompt(prompt_token_ids=list(ids))], params, use_tqdm=False)[0]
            except Exception as error:  # noqa: BLE001 - vLLM's validation error class moved between releases
                text = f"{type(error).__name__}: {error}"
                too_long = bool(_TOO_LONG.search(str(error)))
                return {"accepted": False, "rejection": text if too_long else None, "error": None if too_long else text}
            return _positions(output, top_k)

        if not batched:
            return [run_one(ids) for ids in sequences]
        # vLLM needs room for the one generated token after the prompt.
        return submit_in_batches(sequences, run_batch, run_one, lambda ids: len(ids) >= self.settings.max_model_len)


def _generated(request: Any, token_ids: list[int], wall: float, batch_wall: float) -> dict[str, Any]:
    """One finished request as plain data; `wall` is its own (or its share of the batch's) wall time."""
    completion = request.outputs[0]
    return {
        "accepted": True,
        "rejection": None,
        "error": None,
        "text": completion.text,
        "token_ids": list(completion.token_ids),
        "finish_reason": completion.finish_reason,
        "prompt_tokens": len(request.prompt_token_ids or token_ids),
        "output_tokens": len(completion.token_ids),
        "wall_seconds": wall,
        "timing": _timing(request.metrics, batch_wall),
    }


def _positions(output: Any, top_k: int) -> dict[str, Any]:
    """Plain-data prompt logprobs: position 0 has none (nothing precedes it)."""
    ids = list(output.prompt_token_ids)
    positions = []
    for index, entry in enumerate(output.prompt_logprobs or []):
        if index == 0 or entry is None:
            continue
        token = ids[index]
        ranked = sorted(((tok, lp) for tok, lp in entry.items() if lp.rank is not None and lp.rank <= top_k),
                        key=lambda item: item[1].rank)
        positions.append({
            "token": token,
            "logprob": float(entry[token].logprob) if token in entry else None,
            "top": [[int(tok), float(lp.logprob)] for tok, lp in ranked],
        })
    return {"accepted": True, "rejection": None, "error": None, "positions": positions}


def _timing(metrics: Any, wall: float) -> dict[str, Any]:
    """TTFT and decode speed from vLLM's per-request stats (engine monotonic clock)."""
    if metrics is None:
        return {"ttft_s": None, "decode_tok_s": None, "source": "unavailable"}
    first = getattr(metrics, "first_token_ts", None)
    last = getattr(metrics, "last_token_ts", None)
    scheduled = getattr(metrics, "scheduled_ts", None)
    queued = getattr(metrics, "queued_ts", None)
    generated = getattr(metrics, "num_generation_tokens", None)
    ttft = getattr(metrics, "first_token_latency", None)
    if ttft is None and first and queued:
        ttft = first - queued
    decode = itl = None
    if first and last and generated and generated > 1 and last > first:
        decode = (generated - 1) / (last - first)
        itl = (last - first) / (generated - 1)
    return {
        "ttft_s": ttft,
        "decode_tok_s": decode,
        "itl_s": itl,
        "queue_s": (scheduled - queued) if scheduled and queued else None,
        "generation_tokens": generated,
        "preemptions": getattr(metrics, "num_preemptions", None),
        "source": "vllm RequestStateStats",
    }


def vllm_vocabulary() -> dict[str, Any]:
    """What this vLLM accepts, read from vLLM itself: engine argument names and KV-cache dtypes."""
    import dataclasses
    import typing

    from vllm.engine.arg_utils import EngineArgs

    try:
        from vllm.config.cache import CacheDType
        dtypes = list(typing.get_args(CacheDType))
    except ImportError:  # pragma: no cover - older layouts
        dtypes = []
    return {"vllm_version": vllm_version(), "engine_args": sorted(f.name for f in dataclasses.fields(EngineArgs)),
            "kv_cache_dtypes": dtypes}

