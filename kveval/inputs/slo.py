"""--slo: service-level objectives in vLLM bench's terms (issue 41), e.g. `ttft_p99=2s tpot_p90=80ms`.

vLLM's benchmark counts a request as "good" when its TTFT and TPOT (time per output token after the first)
are within the thresholds given to --goodput (milliseconds); goodput is the rate of good requests. kveval
states an SLO with the percentile that must meet it: `ttft_p99=2s` holds at a concurrency level when 99 %
of its requests (every repeat pooled) have a TTFT of 2 s or less, i.e. the level's p99 TTFT is at most 2 s.
The percentiles are those the throughput table keeps (p50, p90, p99; no suffix: p99). A bare number is in
milliseconds, as vLLM bench's --goodput values are.
"""
from __future__ import annotations

import re
from typing import Literal, Sequence

from pydantic import BaseModel, ConfigDict

PERCENTILES = (50, 90, 99)
METRICS = ("ttft", "tpot")
_TERM = re.compile(r"^(?P<metric>[a-z]+)(?:_p(?P<pct>\d+))?=(?P<value>\d+(?:\.\d+)?)(?P<unit>ms|s)?$")


class SloError(ValueError):
    """A --slo term kveval cannot read; the message says what it expects."""


class SloTarget(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    metric: Literal["ttft", "tpot"]   # tpot: the request's mean inter-token latency (the table's ITL)
    percentile: int                   # share of requests (in %) that must meet the threshold
    seconds: float
    text: str                         # as the user wrote it, normalized (ttft_p99=2s)


def parse_slo(terms: Sequence[str] | None) -> list[SloTarget]:
    """The --slo terms as targets; [] for none. SloError names the bad term and the form expected."""
    targets = []
    for raw in terms or []:
        term = str(raw).strip().lower().replace(" ", "")
        match = _TERM.match(term)
        if not match:
            raise SloError(f"--slo {raw!r}: expected METRIC[_pNN]=VALUE[ms|s] with METRIC one of "
                           f"{', '.join(METRICS)} (e.g. --slo ttft_p99=2s tpot_p99=100ms)")
        metric, pct = match["metric"], int(match["pct"] or 99)
        if metric not in METRICS:
            raise SloError(f"--slo {raw!r}: unknown metric {metric!r}; choose one of {', '.join(METRICS)} "
                           "(vLLM bench's names: time to first token, time per output token)")
        if pct not in PERCENTILES:
            raise SloError(f"--slo {raw!r}: percentile p{pct} is not one kveval measures; use "
                           + ", ".join(f"p{p}" for p in PERCENTILES))
        value = float(match["value"])
        seconds = value if match["unit"] == "s" else value / 1000.0
        if seconds <= 0:
            raise SloError(f"--slo {raw!r}: the threshold must be more than 0")
        targets.append(SloTarget(metric=metric, percentile=pct, seconds=seconds,
                                 text=f"{metric}_p{pct}={_seconds_text(seconds)}"))
    metrics = [(t.metric, t.percentile) for t in targets]
    if len(set(metrics)) != len(metrics):
        raise SloError("--slo names the same metric and percentile twice; give each once")
    return targets


def _seconds_text(seconds: float) -> str:
    return f"{seconds:g}s" if seconds >= 1 else f"{seconds * 1000:g}ms"
