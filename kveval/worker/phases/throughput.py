"""Throughput under concurrency: a sweep of request counts submitted at once on this cell's engine.

FP8 halves the bytes per token, so the same budget holds twice the concurrent long requests; this
phase measures what that buys. At each level N, N copies of one long prompt (a share of
max_model_len, from the run's scoring document) are submitted together, each decoding exactly
`max_tokens` (ignore_eos). vLLM runs as many at once as its KV pool and max_num_seqs allow and
queues the rest, so past the cell's own maximum concurrency requests/s flattens and TTFT grows.
The levels are the suite's, plus the cell's reported maximum concurrency. One run per level.
"""
from __future__ import annotations

from typing import Optional, Union

from pydantic import BaseModel, ConfigDict

from kveval.files.rundir import read_json

MAX_LEVEL = 256   # vLLM's default max_num_seqs: more cannot run at once anyway


class _Capacity(BaseModel):
    """The part of this cell's `capacity` (engine.capacity(), schema.Capacity) the sweep reads."""

    model_config = ConfigDict(extra="ignore")

    max_concurrency: Optional[Union[int, float]] = None   # int stays int: it is stored as given


class _Facts(BaseModel):
    """This cell's facts so far, for its capacity (None before the engine reported one)."""

    model_config = ConfigDict(extra="ignore")

    capacity: Optional[_Capacity] = None


def levels_for(levels: list[int], max_concurrency: float | None) -> list[int]:
    """The suite's levels and the cell's own maximum (whole requests), ascending, at most MAX_LEVEL."""
    chosen = {int(level) for level in levels if 0 < int(level) <= MAX_LEVEL}
    if max_concurrency and max_concurrency >= 1:
        chosen.add(min(int(max_concurrency), MAX_LEVEL))
    return sorted(chosen)


def long_prompt(cell, share: float, max_tokens: int) -> list[int] | None:
    """share × max_model_len tokens of the run's scoring document (or the longest workload prompt),
    leaving room for `max_tokens` new ones."""
    size = min(int(share * cell.max_model_len), cell.max_model_len - max_tokens - 1)
    if size < 16:
        return None
    source: list[int] = []
    if cell.run_dir is not None and cell.run_dir.scoring_path.is_file():
        documents = read_json(cell.run_dir.scoring_path)
        source = max((d["token_ids"] for d in documents), key=len, default=[])
    if len(source) < size:
        source = max((list(p.token_ids) for p in cell.prompts), key=len, default=source)
    while source and len(source) < size:
        source = source + source
    return source[:size] if source else None


def run(engine, cell) -> dict:
    options = cell.options.throughput
    max_tokens, share = options.max_tokens, options.prompt_share
    capacity = _Facts.model_validate(cell.facts).capacity or _Capacity()
    levels = levels_for(options.levels, capacity.max_concurrency)
    prompt = long_prompt(cell, share, max_tokens)
    phase = {"prompt_tokens": len(prompt) if prompt else 0, "max_tokens": max_tokens, "prompt_share": share,
             "levels": levels, "max_concurrency": capacity.max_concurrency, "runs": []}
    if prompt is None:
        phase["error"] = f"no prompt fits: max_model_len {cell.max_model_len} leaves no room for {max_tokens} tokens"
        return phase
    engine.generate_concurrent(prompt, max_tokens, 1)  # warm-up: first-call costs stay out of level 1
    for index, level in enumerate(levels):
        cell.emit(event="step", phase="throughput", done=index, total=len(levels), item=f"concurrency {level}")
        before = engine.preemptions_total()
        outcome = engine.generate_concurrent(prompt, max_tokens, level)
        after = engine.preemptions_total()
        # The engine-wide counter's growth over this level: requests vLLM preempted to make room.
        outcome["preemptions"] = after - before if before is not None and after is not None else None
        phase["runs"].append({"concurrency": level, **outcome})
        cell.checkpoint()
        if not outcome["accepted"]:
            break  # a refusal or error at one level repeats at every larger one
    cell.emit(event="step", phase="throughput", done=len(levels), total=len(levels))
    return phase
