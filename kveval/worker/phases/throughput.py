"""Throughput under concurrency: a sweep of request counts submitted at once on this cell's engine.

FP8 halves the bytes per token, so the same budget holds twice the concurrent long requests; this
phase measures what that buys. At each level N, N copies of one long prompt (a share of
max_model_len, from the run's scoring document) are submitted together, each decoding exactly
`max_tokens` (ignore_eos). vLLM runs as many at once as its KV pool and max_num_seqs allow and
queues the rest, so past the cell's own maximum concurrency requests/s flattens and TTFT grows.
The levels are the suite's, plus the cell's reported maximum concurrency, none above vLLM's max_num_seqs.
Each level runs `repeats` times or more, until the median output tok/s is pinned down (worker/repeats.py),
within the phase's repeat time; each repeat is its own entry of `runs` (with `repeat`).
"""
from __future__ import annotations

from kveval.files import schema
from kveval.worker.phases.context import read_documents
from kveval.worker.repeats import RepeatPlan

# The sweep's largest level: vLLM's max_num_seqs on a CPU and on small GPUs (more cannot run at once there);
# a GPU engine's own may be larger (recent vLLM defaults to 1024 on 70 GiB+ GPUs), but levels past 256 cost
# minutes per repeat.
MAX_LEVEL = 256


def levels_for(levels: list[int], max_concurrency: float | None, max_num_seqs: int | None = None) -> list[int]:
    """The suite's levels and the cell's own maximum (whole requests), ascending, at most MAX_LEVEL and at most
    the engine's max_num_seqs (a level above it would only queue)."""
    top = min(MAX_LEVEL, max_num_seqs) if max_num_seqs else MAX_LEVEL
    chosen = {int(level) for level in levels if 0 < int(level) <= top}
    if max_concurrency and max_concurrency >= 1:
        chosen.add(min(int(max_concurrency), top))
    return sorted(chosen)


def long_prompt(cell, share: float, max_tokens: int) -> list[int] | None:
    """share × max_model_len tokens of the run's scoring document (or the longest workload prompt),
    leaving room for `max_tokens` new ones."""
    size = min(int(share * cell.max_model_len), cell.max_model_len - max_tokens - 1)
    if size < 16:
        return None
    source: list[int] = []
    if cell.run_dir is not None and cell.run_dir.scoring_path.is_file():
        source = max((d.token_ids for d in read_documents(cell.run_dir.scoring_path)), key=len, default=[])
    if len(source) < size:
        source = max((list(p.token_ids) for p in cell.prompts), key=len, default=source)
    while source and len(source) < size:
        source = source + source
    return source[:size] if source else None


def run(engine, cell) -> schema.ThroughputPhase:
    options = cell.options.throughput
    max_tokens, share = options.max_tokens, options.prompt_share
    max_concurrency = cell.capacity.max_concurrency if cell.capacity else None
    max_num_seqs = cell.capacity.max_num_seqs if cell.capacity else None
    levels = levels_for(options.levels, max_concurrency, max_num_seqs)
    prompt = long_prompt(cell, share, max_tokens)
    runs: list[schema.ThroughputRun] = []

    def phase() -> schema.ThroughputPhase:
        return schema.ThroughputPhase(
            prompt_tokens=len(prompt) if prompt else 0, max_tokens=max_tokens, prompt_share=share, levels=levels,
            max_concurrency=max_concurrency, runs=runs, max_num_seqs=max_num_seqs, repeats=options.repeats,
            repeat_max=options.repeat_max, repeat_target=options.repeat_target, repeat_budget_s=options.repeat_budget_s)

    if prompt is None:
        failed = phase()
        failed.error = f"no prompt fits: max_model_len {cell.max_model_len} leaves no room for {max_tokens} tokens"
        return failed
    engine.generate_concurrent(prompt, max_tokens, 1)  # warm-up: first-call costs stay out of level 1
    plan = RepeatPlan(guaranteed=1, minimum=options.repeats, maximum=max(1, options.repeat_max),
                      target=options.repeat_target, budget_s=options.repeat_budget_s, items=len(levels))
    for index, level in enumerate(levels):
        rates: list[float | None] = []
        while plan.more(index, [rates]):
            item = f"concurrency {level}" + (f", repeat {len(rates) + 1}" if rates else "")
            cell.emit(event="step", phase="throughput", done=index, total=len(levels), item=item)
            measured = _one_run(engine, prompt, max_tokens, level, repeat=len(rates))
            runs.append(measured)
            if not measured.accepted:
                break
            rates.append(_output_rate(measured))
        cell.checkpoint()   # once per level: a cell file can be tens of MB, repeats come seconds apart
        if runs and not runs[-1].accepted:
            break  # a refusal or error at one level repeats at every larger one
    cell.emit(event="step", phase="throughput", done=len(levels), total=len(levels))
    return phase()


def _one_run(engine, prompt: list[int], max_tokens: int, level: int, repeat: int) -> schema.ThroughputRun:
    before = engine.preemptions_total()
    outcome = engine.generate_concurrent(prompt, max_tokens, level)
    after = engine.preemptions_total()
    # The engine-wide counter's growth over this run: requests vLLM preempted to make room.
    preempted = after - before if before is not None and after is not None else None
    return schema.ThroughputRun(concurrency=level, **outcome, preemptions=preempted, repeat=repeat)


def _output_rate(measured: schema.ThroughputRun) -> float | None:
    """Output tokens/s of one run (what analysis/throughput's rows report)."""
    tokens = sum(r.output_tokens or 0 for r in measured.requests or [])
    return tokens / measured.wall_seconds if measured.wall_seconds else None
