"""Plant FP8-specific damage in a model while leaving its `auto` (bf16) behaviour unchanged.

Attention scores use q·k, so scaling each chosen layer's K projection by f and its Q projection by
1/f changes nothing in exact arithmetic — but K values grow f-fold and pass the FP8 e4m3 range
(±448), which an unscaled FP8 KV cache clips. Scaling V by f and the output projection by 1/f does
the same to V. With f a power of two the rescaling is exact in bf16, so `auto` outputs stay
bit-identical while `fp8` is genuinely harmed.

    python -m tests.support.planted SRC_DIR DST_DIR --tensor k --factor 128 [--layers 0,5,10]
"""
from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

PAIRS = {"k": ("k_proj", "q_proj"), "v": ("v_proj", "o_proj")}


def plant(src: Path, dst: Path, *, tensor: str = "k", factor: float = 128.0, layers: list[int] | None = None) -> Path:
    import torch
    from safetensors.torch import load_file, save_file

    grow, shrink = PAIRS[tensor]
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(src, dst)
    weights_path = dst / "model.safetensors"
    weights = load_file(str(weights_path))
    touched = []
    for name in list(weights):
        parts = name.split(".")
        if "layers" not in parts:
            continue
        layer = int(parts[parts.index("layers") + 1])
        if layers is not None and layer not in layers:
            continue
        if name.endswith(f"{grow}.weight"):
            weights[name] = (weights[name].to(torch.float32) * factor).to(weights[name].dtype)
            touched.append(name)
        elif name.endswith(f"{shrink}.weight"):
            weights[name] = (weights[name].to(torch.float32) / factor).to(weights[name].dtype)
            touched.append(name)
        elif name.endswith(f"{grow}.bias"):
            weights[name] = (weights[name].to(torch.float32) * factor).to(weights[name].dtype)
    if not touched:
        raise ValueError(f"no {grow}/{shrink} weights found in {weights_path}")
    save_file(weights, str(weights_path), metadata={"format": "pt"})
    (dst / "kveval-planted.json").write_text(json.dumps(
        {"source": str(src), "tensor": tensor, "factor": factor, "layers": layers, "touched": len(touched)}))
    return dst


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("src", type=Path)
    parser.add_argument("dst", type=Path)
    parser.add_argument("--tensor", choices=sorted(PAIRS), default="k")
    parser.add_argument("--factor", type=float, default=128.0)
    parser.add_argument("--layers", default=None, help="comma list of layer indices (default: all)")
    args = parser.parse_args()
    layers = [int(x) for x in args.layers.split(",")] if args.layers else None
    print(plant(args.src, args.dst, tensor=args.tensor, factor=args.factor, layers=layers))


if __name__ == "__main__":
    main()
