"""Read back the K/V/Q scales vLLM's engine holds for a checkpoint (docs/calibration.md): whether a
calibrated copy's scales reached the engine, not only its files.

    .venv/bin/python scripts/engine_kv_scales.py CHECKPOINT_DIR [LAYER ...]   (default layers 0 1 10)

Runs vLLM in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0, so the model object is reachable), with an
FP8 cache, 40 MiB of KV budget and max_model_len 1024, and prints each layer's `_k_scale`, `_v_scale`,
`_q_scale` as the attention layer holds them, then one greedy answer."""
from __future__ import annotations

import os
import sys

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__.strip().splitlines()[3], file=sys.stderr)
        return 2
    from vllm import LLM, SamplingParams

    layers = [int(x) for x in argv[1:]] or [0, 1, 10]
    llm = LLM(argv[0], kv_cache_dtype="fp8", max_model_len=1024, kv_cache_memory_bytes=40 << 20,
              enforce_eager=True)
    model = llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.worker.model_runner.model
    for index in layers:
        attention = model.model.layers[index].self_attn.attn
        print(f"layer {index}: k_scale {float(attention._k_scale):.6g} v_scale {float(attention._v_scale):.6g} "
              f"q_scale {float(attention._q_scale):.6g}")
    answer = llm.generate(["The capital of France is"], SamplingParams(max_tokens=16, temperature=0))
    print("greedy:", repr(answer[0].outputs[0].text))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
