"""Quantized-weight copies of the default model with llm-compressor (issue 38), as vLLM serves them: FP8-dynamic
(compressed-tensors, float-quantized, like the RTX 4070 field report's model) and W4A16 (int4 weights in groups
of 64, pack-quantized; SmolLM2's 576 columns do not divide into llm-compressor's default groups of 128). Data-free
(round to nearest), so no calibration set is needed. Run with the llm-compressor toolkit kveval installs for
calibration on its path:
  PYTHONPATH=~/.cache/kveval/calibration/llmcompressor-0.14.0.1 python scripts/make_quantized.py fp8-dynamic OUT
  PYTHONPATH=... python scripts/make_quantized.py w4a16 OUT [MODEL_DIR]"""
from __future__ import annotations

import sys
from pathlib import Path

from llmcompressor import oneshot
from llmcompressor.modifiers.quantization import QuantizationModifier
from transformers import AutoModelForCausalLM, AutoTokenizer

W4A16_G64 = {"group_0": {"targets": ["Linear"], "weights": {"num_bits": 4, "type": "int", "symmetric": True,
                                                             "strategy": "group", "group_size": 64}}}


def main(kind: str, out: str, source: str) -> None:
    model = AutoModelForCausalLM.from_pretrained(source, dtype="bfloat16")
    recipe = (QuantizationModifier(targets="Linear", scheme="FP8_DYNAMIC", ignore=["lm_head"]) if kind == "fp8-dynamic"
              else QuantizationModifier(config_groups=W4A16_G64, ignore=["lm_head"]))
    oneshot(model=model, recipe=recipe)
    model.save_pretrained(out, save_compressed=True)
    AutoTokenizer.from_pretrained(source).save_pretrained(out)


if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[1] not in ("fp8-dynamic", "w4a16"):
        sys.exit("usage: make_quantized.py fp8-dynamic|w4a16 OUT [MODEL_DIR]")
    main(sys.argv[1], sys.argv[2],
         sys.argv[3] if len(sys.argv) > 3 else str(Path.home() / ".cache/kveval/models/SmolLM2-135M-Instruct"))
