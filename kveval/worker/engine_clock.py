"""Where a phase's time goes (issue 18): the wall time spent inside engine calls, and their token work.

`EngineClock` stands in front of the engine (vLLM's or the fake) for the phases. Every call that runs
requests adds its wall time and the tokens it processed (prompt + generated, or the scored sequence);
`lap()` hands the totals since the last lap to the cell loop, which stores them as the phase's
`engine_seconds`: the rest of the phase's time is kveval's own. The engine itself (`clock.engine`) is
reachable untimed, for the efficiency reference (worker/efficiency.py).
"""
from __future__ import annotations

import time
from typing import Any

from kveval.worker.engine_results import Concurrent, Generated, Scored

# The engine methods that run requests (the rest are read-only facts).
_TIMED = ("generate", "generate_batch", "generate_concurrent", "score")


class EngineClock:
    def __init__(self, engine: Any):
        self.engine = engine
        self.seconds = 0.0
        self.tokens = 0

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self.engine, name)
        if name not in _TIMED:
            return attribute

        def timed(*args, **kwargs):
            began = time.perf_counter()
            try:
                result = attribute(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - began
            self.tokens += tokens_of(name, args, result)
            return result

        return timed

    def lap(self) -> tuple[float, int]:
        """Seconds and tokens since the last lap."""
        lapped = (self.seconds, self.tokens)
        self.seconds, self.tokens = 0.0, 0
        return lapped


def tokens_of(method: str, args: tuple, result: Any) -> int:
    """Token work of one engine call: prompt + generated tokens of accepted requests, or the length of
    each accepted scored sequence (a refused request did no work)."""
    if method == "generate":
        return _generated_tokens(result)
    if method == "generate_batch":
        return sum(_generated_tokens(one) for one in result)
    if method == "generate_concurrent":
        concurrent = Concurrent.model_validate(result)
        return sum(len(args[0]) + (request.output_tokens or 0) for request in concurrent.requests) \
            if concurrent.accepted else 0
    if method == "score":
        return sum(len(ids) for ids, scored in zip(args[0], result) if Scored.model_validate(scored).accepted)
    return 0


def _generated_tokens(result: dict) -> int:
    generated = Generated.model_validate(result)
    if not generated.accepted:
        return 0
    return (generated.prompt_tokens or 0) + (generated.output_tokens or 0)
