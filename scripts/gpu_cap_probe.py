"""The --gpu-memory-utilization that caps a GPU so that `auto` cannot hold one request of a length while FP8 can
(issue 39's capped card, made on a large GPU). Starts vLLM once with `auto` at the length on a generous share,
reads the KV memory vLLM finds there ("Available KV cache memory: X GiB"), and prints the share whose KV memory
falls midway between FP8's need and auto's need for one request (vLLM's KV memory grows linearly with the share:
share x total - what the weights, activations and graphs take). Run on the GPU machine:

    python scripts/gpu_cap_probe.py MODEL_DIR 32768          # prints e.g. 0.0612
"""
from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kveval.inputs.model_config import ModelSource, model_facts  # noqa: E402
_AVAILABLE = re.compile(r"Available KV cache memory: ([\d.]+) GiB")
_PROBE = """
import json, sys, torch
from vllm import LLM
llm = LLM(model=sys.argv[1], max_model_len=int(sys.argv[2]), gpu_memory_utilization=float(sys.argv[3]),
          enable_prefix_caching=False)
print("TOTAL_GIB", torch.cuda.mem_get_info()[1] / 2 ** 30, flush=True)
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("length", type=int)
    parser.add_argument("--probe-share", type=float, default=0.2)
    args = parser.parse_args()
    layout = model_facts(ModelSource.of(args.model, {})).kv_layout
    per_token = layout["per_layer_elements"] * layout["layers"] * 2   # bf16 bytes per token, every K/V layer
    done = subprocess.run([sys.executable, "-c", _PROBE, args.model, str(args.length), str(args.probe_share)],
                          capture_output=True, text=True)
    text = done.stdout + done.stderr
    available = _AVAILABLE.search(text)
    total = re.search(r"TOTAL_GIB ([\d.]+)", text)
    if available is None or total is None:
        sys.exit("gpu_cap_probe.py: vLLM did not say its KV memory:\n" + text[-3000:])
    auto_need = per_token * args.length / 2 ** 30
    target = 0.75 * auto_need           # FP8 needs half of auto's: midway between the two
    share = args.probe_share - (float(available.group(1)) - target) / float(total.group(1))
    print(f"{share:.4f}")
    print(f"probe: {available.group(1)} GiB KV at share {args.probe_share} of {float(total.group(1)):.1f} GiB; auto needs "
          f"{auto_need:.3f} GiB, FP8 {auto_need / 2:.3f}; target {target:.3f} GiB", file=sys.stderr)


if __name__ == "__main__":
    main()
