"""What an engine's calls return, as the cell reads them: a generation, a teacher-forced scoring, and
what the engine says about itself.

The engines (worker/engine.py, and the tests' worker/fake_engine.py) return plain dicts, which the
phases store in the cell file as they are (schema.GenerationRecord, schema.ScoredSequence); a phase
that reads one of them parses it once with these models. Keys an engine adds beyond these are ignored.
"""
from __future__ import annotations

from typing import Any, Optional, Union

from pydantic import BaseModel, ConfigDict

from kveval.files import schema


class _Result(BaseModel):
    model_config = ConfigDict(extra="ignore")

    accepted: bool
    rejection: Optional[str] = None   # vLLM refused the prompt (too long for max_model_len), in its words
    error: Optional[str] = None       # any other failure


class Generated(_Result):
    """engine.generate / generate_batch: one prompt's greedy answer."""

    text: Optional[str] = None
    finish_reason: Optional[str] = None
    prompt_tokens: Optional[int] = None
    output_tokens: Optional[int] = None
    wall_seconds: Optional[Union[int, float]] = None
    timing: Optional[schema.Timing] = None   # vLLM's per-request stats, as the cell file stores them


class Scored(_Result):
    """engine.score: one sequence's prompt logprobs, one position per token after the first
    ({"token", "logprob", "top": [[token, logprob], ...]}), kept as the engine gave them."""

    positions: Optional[list[Any]] = None


class ConcurrentRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    output_tokens: Optional[int] = None


class Concurrent(BaseModel):
    """engine.generate_concurrent: copies of one prompt submitted at once."""

    model_config = ConfigDict(extra="ignore")

    accepted: bool
    requests: list[ConcurrentRequest] = []


class EngineInfo(BaseModel):
    """engine.info(): what the cell file stores as `info` (schema.CellInfo); the cell reads the backend."""

    model_config = ConfigDict(extra="ignore")

    attention_backend: Optional[str] = None   # None: the engine could not tell (the log may: cell_main)
    platform: Optional[str] = None            # vLLM's platform: cuda, rocm, cpu, xpu, ... (inputs/device_platform.py)
    device_name: Optional[str] = None
    device_capability: Optional[str] = None   # "9.0"; None on a CPU
