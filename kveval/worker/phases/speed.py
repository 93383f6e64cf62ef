"""Speed at concurrency 1: TTFT and decode tok/s per workload, warm-up runs then measured runs.

One representative prompt per workload (its first), decoded to exactly its max_tokens
(ignore_eos) so every cell times the same amount of work. The prefix cache is off in every cell
(engine.py), so repeated runs really prefill. After the `runs` measured runs a workload runs again until
the medians of TTFT and decode tok/s are pinned down (worker/repeats.py), within the phase's repeat time.
"""
from __future__ import annotations

import statistics
from typing import Optional, Sequence

from kveval.files import schema
from kveval.worker.engine_results import Generated
from kveval.worker.repeats import RepeatPlan


def _summary(values: Sequence[Optional[float]]) -> schema.Spread:
    clean = [v for v in values if v is not None]
    if not clean:
        return schema.Spread(median=None, min=None, max=None, stdev=None, n=0)
    return schema.Spread(median=statistics.median(clean), min=min(clean), max=max(clean),
                         stdev=statistics.stdev(clean) if len(clean) > 1 else 0.0, n=len(clean))


def _representatives(cell, workloads: list[str] | None) -> list:
    chosen, seen = [], set()
    for prompt in cell.prompts:
        if prompt.workload in seen or prompt.kind in ("over_limit", "probe"):  # probes: quality only
            continue
        if workloads is not None and prompt.workload not in workloads:
            continue
        seen.add(prompt.workload)
        chosen.append(prompt)
    return chosen


def run(engine, cell) -> schema.SpeedPhase:
    options = cell.options.speed
    runs, warmup, max_tokens_cap = options.runs, options.warmup, options.max_tokens
    prompts = _representatives(cell, options.workloads)
    plan = RepeatPlan(guaranteed=runs, minimum=runs, maximum=max(runs, options.repeat_max),
                      target=options.repeat_target, budget_s=options.repeat_budget_s, items=len(prompts))
    results = []
    for index, prompt in enumerate(prompts):
        cell.emit(event="step", phase="speed", done=index, total=len(prompts), item=prompt.workload)
        max_tokens = min(prompt.max_tokens, max_tokens_cap) if max_tokens_cap else prompt.max_tokens
        measured: list[schema.SpeedRun] = []
        refused = None   # vLLM's words when it refused the prompt (a refusal is stored, not timed)
        attempt = 0
        while attempt < warmup or plan.more(index, [[r.ttft_s for r in measured], [r.decode_tok_s for r in measured]]):
            outcome = Generated.model_validate(engine.generate(list(prompt.token_ids), max_tokens, ignore_eos=True))
            attempt += 1
            if not outcome.accepted:
                refused = outcome.rejection or outcome.error
                break
            if attempt <= warmup:
                continue
            output_tokens, wall = outcome.output_tokens or 0, outcome.wall_seconds or 0.0
            timing = schema.dump(outcome.timing) if outcome.timing is not None else {}
            measured.append(schema.SpeedRun(**timing, output_tokens=outcome.output_tokens, wall_seconds=outcome.wall_seconds,
                                            throughput_tok_s=output_tokens / wall))
        # A refused prompt's entry says why between its runs and its summaries, as the cell file always had it.
        refusal = {"rejection": refused} if refused is not None else {}
        results.append(schema.SpeedWorkload(
            workload=prompt.workload, prompt_id=prompt.id, prompt_tokens=len(prompt.token_ids), max_tokens=max_tokens,
            runs=measured, **refusal, ttft_s=_summary([r.ttft_s for r in measured]),
            decode_tok_s=_summary([r.decode_tok_s for r in measured]),
            throughput_tok_s=_summary([r.throughput_tok_s for r in measured])))
    cell.emit(event="step", phase="speed", done=len(prompts), total=len(prompts))
    return schema.SpeedPhase(concurrency=1, warmup_runs=warmup, measured_runs=runs, workloads=results,
                             repeat_max=plan.maximum, repeat_target=options.repeat_target,
                             repeat_budget_s=options.repeat_budget_s)
