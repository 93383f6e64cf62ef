"""Engine efficiency of a phase (issue 18): how close to the engine's own limit the phase ran.

efficiency = (the phase's tokens / its time inside engine calls) ÷ (reference tokens / reference time),
where the reference is ONE batched call (`LLM.generate`, or prompt-logprobs for scoring) of the phase's
own accepted requests (all of them, or an evenly spread sample of `sample` when there are more), on the
same engine, right after the phase. A batch's tokens per second grow with its size, so only a reference
of the phase's own size says how close to the engine's limit the phase ran; it repeats the phase's
work, so only the run's first cell measures it (run/plan.plan_cells). Below 1: the phase fed
the engine worse than a plain batched call would (requests one at a time, refusals splitting batches,
small batches); above 1: the phase's batches were larger than the sample's. The reference runs on the
engine behind the clock, so it is not counted in the phase's engine time. Neither is the scoring phase's
16-token warm-up call (worker/phases/scoring._warm_up): an engine's first prompt-logprobs call pays a
one-time set-up whatever its size, which no batching causes and the reference, right after, no longer pays.
"""
from __future__ import annotations

import time
from typing import Any, Literal, Optional, Sequence

from kveval.files.schema import PhaseEfficiency
from kveval.worker.engine_clock import EngineClock, tokens_of

METHOD = ("phase tokens per second inside engine calls ÷ tokens per second of one batched call of {n} "
          "of the phase's {total} accepted requests (evenly spread) on the same engine, right after the phase")


def measure(engine: Any, kind: Literal["generate", "score"], accepted: Sequence[Any], sample: int,
            top_k: Optional[int] = None) -> Optional[PhaseEfficiency]:
    """The phase's efficiency, or None when there is nothing to compare (no clock, no sample, no time).
    `accepted`: generate_batch requests (ids, max_tokens, stop) or scored sequences (token ids)."""
    if not isinstance(engine, EngineClock) or sample <= 0 or not accepted or engine.seconds <= 0 or engine.tokens <= 0:
        return None
    step = max(1, -(-len(accepted) // sample))   # evenly spread, at most `sample`
    chosen = list(accepted[::step])
    began = time.perf_counter()
    if kind == "generate":
        result = engine.engine.generate_batch(chosen)
        reference_tokens = tokens_of("generate_batch", (chosen,), result)
    else:
        result = engine.engine.score(chosen, top_k)
        reference_tokens = tokens_of("score", (chosen,), result)
    reference_seconds = time.perf_counter() - began
    if reference_tokens <= 0 or reference_seconds <= 0:
        return None
    ratio = (engine.tokens / engine.seconds) / (reference_tokens / reference_seconds)
    return PhaseEfficiency(tokens=engine.tokens, engine_seconds=round(engine.seconds, 4),
                           reference_requests=len(chosen), reference_tokens=reference_tokens,
                           reference_seconds=round(reference_seconds, 4), ratio=round(ratio, 4),
                           method=METHOD.format(n=len(chosen), total=len(accepted)))
