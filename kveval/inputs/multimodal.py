"""Multimodal checkpoints (issue 38): a config with a text model beside a vision (or audio) encoder, such as
Gemma3ForConditionalGeneration, Qwen2.5-VL or Qwen3.5. kveval runs the text model: its prompts are text, and
the K/V bytes per token come from the text config (model_config reads `get_text_config()`).

vLLM (0.32, model_executor/models/interfaces.SupportsMultiModal._mark_tower_model) builds and loads the
encoder and projector unless every modality's `limit_mm_per_prompt` is 0 (`--language-model-only` sets all to
0); loaded, they are fixed memory beside the text weights, and its start-up profile also runs the encoder on
dummy images, so with a budget left by gpu_memory_utilization the KV pool is smaller for every KV dtype alike.
kveval serves the checkpoint as `vllm serve` does by default (encoder loaded) and says so; the encoder's
bytes are read from the safetensors headers of a local checkpoint (no weights are loaded).
"""
from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Optional

from pydantic import BaseModel, ConfigDict

# Sub-configs that name an encoder, and its modality.
ENCODER_CONFIGS = {"vision_config": "vision", "audio_config": "audio", "speech_config": "audio"}
# Weight-name parts of encoders and their projectors across transformers' multimodal classes (Gemma-3,
# Gemma-3n, Qwen2/2.5/3-VL, Qwen3.5, LLaVA, Mistral-3, Llama-4, Idefics/SmolVLM, InternVL).
ENCODER_PARTS = {"vision_tower", "visual", "vision_model", "vision_encoder", "multi_modal_projector", "mm_projector",
                 "audio_tower", "audio_model", "embed_vision", "embed_audio", "image_newline", "connector"}
DTYPE_BYTES = {"F64": 8, "F32": 4, "BF16": 2, "F16": 2, "F8_E4M3": 1, "F8_E5M2": 1, "I64": 8, "I32": 4, "I16": 2,
               "I8": 1, "U8": 1, "BOOL": 1}


class Encoder(BaseModel):
    """The checkpoint's encoder(s) beside its text model."""

    model_config = ConfigDict(frozen=True)

    architecture: Optional[str] = None
    modalities: list[str]              # "vision", "audio"
    weight_bytes: Optional[int] = None   # encoder and projector weights on disk (None: not a local safetensors model)


def multimodal_encoder(config, path: str | Path | None) -> Encoder | None:
    """The encoder of a multimodal config (transformers object), or None for a text-only model."""
    modalities = sorted({modality for name, modality in ENCODER_CONFIGS.items() if getattr(config, name, None)})
    if not modalities:
        return None
    architectures = getattr(config, "architectures", None) or []
    return Encoder(architecture=architectures[0] if architectures else None, modalities=modalities,
                   weight_bytes=encoder_weight_bytes(path) if path else None)


def encoder_weight_bytes(path: str | Path) -> int | None:
    """Bytes of the encoder's and projector's tensors in a local checkpoint's safetensors files (their headers
    only), or None where there are none to read (a hub id, .bin weights, an unreadable file)."""
    files = sorted(Path(path).glob("*.safetensors")) if Path(path).is_dir() else []
    if not files:
        return None
    total = 0
    for file in files:
        header = _header(file)
        if header is None:
            return None
        for name, entry in header.items():
            if name != "__metadata__" and ENCODER_PARTS.intersection(name.split(".")):
                start, end = entry["data_offsets"]
                total += end - start
    return total


def _header(file: Path) -> dict | None:
    """A safetensors file's JSON header: 8 bytes of little-endian length, then the JSON."""
    try:
        with open(file, "rb") as handle:
            (size,) = struct.unpack("<Q", handle.read(8))
            return json.loads(handle.read(size))
    except (OSError, ValueError, struct.error):
        return None
