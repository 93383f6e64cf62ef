"""The text FP8 scales are calibrated on: data/calibration/*.txt, never used for prompts, scoring or
tasks (data/README.md), so a calibrated scale is not fitted on the text it is judged on."""
from __future__ import annotations

import re
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from kveval.inputs.workloads.chat import encode

CALIBRATION_DIR = Path(__file__).resolve().parent / "data" / "calibration"
SAMPLE_TOKENS = 512      # per calibration sample (llm-compressor's examples use 512-2048)
MAX_SAMPLES = 32


class CalibrationDocuments(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    names: list[str]                 # the files the samples were cut from
    token_ids: list[list[int]]       # each sample: the tokenizer's prefix (e.g. BOS), then plain text

    @classmethod
    def build(cls, tokenizer, directory: Path = CALIBRATION_DIR, sample_tokens: int = SAMPLE_TOKENS,
              max_samples: int = MAX_SAMPLES) -> "CalibrationDocuments":
        files = sorted(Path(directory).glob("*.txt"))
        if not files:
            raise ValueError(f"no calibration text in {directory}/*.txt")
        prefix_and_x = encode(tokenizer, "x", add_special_tokens=True)
        bare_x = encode(tokenizer, "x")
        prefix = [t for t in prefix_and_x if t not in bare_x]
        samples = []
        for file in files:   # one file, one stream: a sample never spans two essays
            text = " ".join(re.split(r"\s+", file.read_text(encoding="utf-8").strip()))
            body = encode(tokenizer, text)
            step = sample_tokens - len(prefix)
            samples += [prefix + body[start:start + step] for start in range(0, len(body), step)
                        if len(body[start:start + step]) >= step // 4]
        return cls(names=[file.name for file in files], token_ids=samples[:max_samples])
