"""Which part of FA3's FP8 attention harms a model: an emulation with transformers on the CPU (issue 23 part 4).

vLLM's FlashAttention-3 path with an FP8 KV cache quantises K and V (the cache), and also Q, and FA3's FP8
kernel feeds the softmax probabilities P to its second GEMM in FP8 too. This script runs one document
through the model once exactly (bf16 weights, fp32 attention) and once per variant in which chosen
tensors of chosen layers are rounded to FP8 e4m3 at scale 1.0 (saturating at ±448), and prints the KL
of each variant's next-token distribution from the exact one, per position band, so the variants tell
which rounding does the damage and in which layers. It is arithmetic on the real weights, not vLLM's
kernels: accumulation order and FA3's tiling are not reproduced.

    python scripts/fp8_attention_emulation.py MODEL_DIR [--tokens 1024] [--variants kv,qkvp,...]
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

FP8_MAX = 448.0
CORPUS = Path(__file__).resolve().parents[1] / "kveval" / "inputs" / "data" / "corpus"

# name -> (tensors rounded, "s": at a per-tensor scale; layers: "all", "all-but-0" or "0")
VARIANTS = {
    "kv": ("kv", "all"),
    "qkv": ("qkv", "all"),
    "qkvp": ("qkvp", "all"),
    "kvp": ("kvp", "all"),
    "qkvp-keep0": ("qkvp", "all-but-0"),
    "qkvp-layer0": ("qkvp", "0"),
    "kv-layer0": ("kv", "0"),
    "q-layer0": ("q", "0"),
    "k-layer0": ("k", "0"),
    "v-layer0": ("v", "0"),
    "kv-scaled": ("kvs", "all"),          # per-tensor scale amax/448 instead of 1.0
    "kv-layer0-scaled": ("kvs", "0"),
}


def fp8(x: torch.Tensor, scaled: bool = False) -> torch.Tensor:
    """x rounded to FP8 e4m3: at scale 1.0 (vLLM without checkpoint scales), or at the per-tensor scale
    amax / 448 (the best a calibrated per-tensor scale can do for this very tensor)."""
    x = x.float()
    scale = (x.abs().amax() / FP8_MAX).clamp(min=1e-12) if scaled else torch.tensor(1.0)
    return (x / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).float() * scale


class Emulation:
    """The attention function: exact fp32 attention, with the configured tensors rounded to FP8."""

    def __init__(self):
        self.tensors, self.layers = "", "all"

    def applies(self, layer: int) -> bool:
        return (self.layers == "all" or (self.layers == "all-but-0" and layer != 0)
                or (self.layers == "0" and layer == 0))

    def __call__(self, module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        q, k, v = query.float(), key.float(), value.float()
        on = self.applies(module.layer_idx)
        scaled = "s" in self.tensors
        if on and "q" in self.tensors:
            q = fp8(q, scaled)
        if on and "k" in self.tensors:
            k = fp8(k, scaled)
        if on and "v" in self.tensors:
            v = fp8(v, scaled)
        groups = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        scores = (q @ k.transpose(-1, -2)) * (scaling if scaling is not None else module.scaling)
        n = scores.shape[-1]
        causal = torch.ones(n, n, dtype=torch.bool).triu(1)
        scores = scores.masked_fill(causal, float("-inf"))
        p = torch.exp(scores - scores.amax(dim=-1, keepdim=True))   # FA3 keeps the row sum in fp32
        total = p.sum(dim=-1, keepdim=True)
        if on and "p" in self.tensors:
            p = fp8(p)
        out = (p @ v) / total
        return out.transpose(1, 2).contiguous().to(query.dtype), None


def document(tokenizer, tokens: int) -> torch.Tensor:
    text = "\n\n".join(p.read_text() for p in sorted(CORPUS.glob("*.txt")))
    ids = tokenizer(text)["input_ids"][:tokens]
    return torch.tensor([ids])


def log_probs(model, ids) -> torch.Tensor:
    with torch.no_grad():
        return torch.log_softmax(model(ids).logits[0].float(), dim=-1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    args = parser.parse_args()
    from transformers import AttentionInterface, AutoModelForCausalLM, AutoTokenizer

    emulation = Emulation()
    AttentionInterface.register("fp8_emulation", emulation)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.bfloat16, attn_implementation="fp8_emulation")
    model.eval()
    from kveval.worker.kv_ranges import _fast_cpu_linears
    _fast_cpu_linears(model)   # bf16 GEMMs as fp32 GEMMs rounded to bf16: the same arithmetic, faster on CPUs
    ids = document(tokenizer, args.tokens)
    began = time.time()
    exact = log_probs(model, ids)
    print(f"model {args.model}: {ids.shape[1]} tokens, exact pass {time.time() - began:.0f} s", flush=True)
    bands = [(a, min(b, ids.shape[1])) for a, b in ((0, 128), (128, 256), (256, 512), (512, 1 << 20)) if a < ids.shape[1]]
    print(f"{'variant':14s} {'KL mean':>8s} {'top-1':>6s}  " + "  ".join(f"KL {a}-{b}" for a, b in bands))
    for name in args.variants.split(","):
        emulation.tensors, emulation.layers = VARIANTS[name]
        got = log_probs(model, ids)
        kl = (exact.exp() * (exact - got)).sum(dim=-1)
        top1 = (exact.argmax(-1) == got.argmax(-1)).float().mean().item()
        per_band = "  ".join(f"{kl[a:b].mean().item():10.4f}" for a, b in bands)
        print(f"{name:14s} {kl.mean().item():8.4f} {100 * top1:5.1f}%  {per_band}", flush=True)
        emulation.tensors = ""


if __name__ == "__main__":
    main()
