"""The calibration child's test double (KVEVAL_ENGINE=fake, like worker/fake_engine.py): a checkpoint
copy that carries a compressed-tensors kv_cache_scheme and K/V scale tensors, written without
llm-compressor, so the orchestration of `fp8:scaled` cells and `--search` is tested in seconds. The
scales are fixed numbers: nothing is calibrated."""
from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

from kveval.files.calibration import CalibrationRecord, CalibrationRequest, publish_copy

FAKE_SCALE = 0.02


def calibrate(request: CalibrationRequest) -> dict:
    import numpy as np
    from safetensors.numpy import save_file

    out, partial = Path(request.out), Path(request.out + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    shutil.copytree(request.model, partial)
    config = json.loads((partial / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "compressed-tensors", "format": "dense", "config_groups": {},
                                     "kv_cache_scheme": {"num_bits": 8, "type": "float", "strategy": request.strategy,
                                                         "dynamic": False, "symmetric": True}}
    (partial / "config.json").write_text(json.dumps(config, indent=1))
    layers = int(config.get("num_hidden_layers") or 1)
    heads = int(config.get("num_key_value_heads") or config.get("num_attention_heads") or 1)
    shape = (heads, 1, 1) if request.strategy == "attn_head" else (1,)
    save_file({f"model.layers.{layer}.self_attn.{t}_scale": np.full(shape, FAKE_SCALE, dtype=np.float32)
               for layer in range(layers) for t in ("k", "v")}, str(partial / "kv_scales.safetensors"))
    record = CalibrationRecord.of(request, device="fake", seconds=0.0, llmcompressor="fake", compressed_tensors="fake",
                                  made=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    return publish_copy(partial, out, record)
