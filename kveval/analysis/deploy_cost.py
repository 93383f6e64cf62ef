"""What the configuration to deploy costs against `auto` (issue 41): its output tok/s × auto at each
concurrency level measured and its TTFT × auto per speed workload, at the max_model_len it is deployed
with, each with its interval (analysis/repeat_interval) where the cells repeated their runs. Pure: the
evidence's rows in, schema.DeploymentCost out; None when nothing was measured against `auto` there.
"""
from __future__ import annotations

import math

from kveval.analysis.cell_records import BASELINE_KV
from kveval.analysis.repeat_interval import CONFIDENCE
from kveval.files import schema


def _number(value: float | None) -> float | None:
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else float(value)


def throughput_costs(spec: str, max_model_len: int, rows: list[schema.ThroughputRow] | None) -> list[schema.CostRatio]:
    """Output tok/s × auto per level, ascending."""
    out = []
    for row in sorted(rows or [], key=lambda r: r.concurrency or 0):
        ratio = _number(row.output_tok_s_vs_baseline)
        if row.kv_spec != spec or row.max_model_len != max_model_len or ratio is None:
            continue
        level = int(row.concurrency or 0)
        out.append(schema.CostRatio(figure="output_tok_s", where=f"concurrency {level}", concurrency=level, ratio=ratio,
                                    low=_number(row.vs_baseline_low), high=_number(row.vs_baseline_high),
                                    confidence=_number(row.vs_baseline_confidence)))
    return out


def ttft_costs(spec: str, max_model_len: int, rows: list[schema.SpeedRow] | None) -> list[schema.CostRatio]:
    """TTFT × auto per speed workload (concurrency 1): the repeats' ratio, or for runs before issue 41 the
    ratio of the medians (their Δ %), without an interval."""
    out = []
    for row in rows or []:
        if row.kv_spec != spec or row.max_model_len != max_model_len:
            continue
        ratio = _number(row.ttft_ratio)
        delta = _number(row.ttft_delta_pct)
        if ratio is None and delta is not None:
            ratio = 1.0 + delta / 100.0
        if ratio is None:
            continue
        tokens = f"the {int(row.prompt_tokens):,}-token prompt ({row.workload})" if row.prompt_tokens else row.workload
        out.append(schema.CostRatio(figure="ttft", where=tokens, ratio=ratio,
                                    prompt_tokens=int(row.prompt_tokens) if row.prompt_tokens is not None else None,
                                    low=_number(row.ttft_ratio_low), high=_number(row.ttft_ratio_high),
                                    confidence=_number(row.ttft_ratio_confidence)))
    return out


def _interval(cost: schema.CostRatio, percent: bool = False) -> str:
    """" (0.85–0.95)" or " (+150 to +200 %)", with the interval's coverage where few repeats leave it under 95 %."""
    if cost.low is None or cost.high is None:
        return ""
    coverage = "" if (cost.confidence or 0) >= CONFIDENCE - 1e-9 else f", {100 * (cost.confidence or 0):.0f} % coverage"
    if percent:
        return f" ({100 * (cost.low - 1):+.0f} to {100 * (cost.high - 1):+.0f} %{coverage})"
    return f" ({cost.low:.2f}–{cost.high:.2f}{coverage})"


def _times(value: float) -> str:
    return f"{value:.2f}×"


def _percent(value: float) -> str:
    return f"{100 * (value - 1):+.0f} %"


def cost_line(cost_max_model_len: int, throughput: list[schema.CostRatio], ttft: list[schema.CostRatio]) -> str:
    """One line: output tok/s × auto at every level, and the TTFT change on the longest prompt (where the KV
    cache's dtype weighs most; a short prompt's few milliseconds of TTFT move with anything)."""
    parts = []
    if throughput:
        parts.append("output tok/s " + ", ".join(f"{_times(c.ratio)}{_interval(c)} at {c.concurrency}"
                                                 for c in throughput) + " concurrent")
    if ttft:
        longest = max(ttft, key=lambda c: c.prompt_tokens or 0)
        parts.append(f"TTFT {_percent(longest.ratio)}{_interval(longest, percent=True)} on {longest.where}")
    intervals = any(c.low is not None for c in throughput + ttft)
    source = "intervals over the repeats, 95 % unless a coverage is given" if intervals else "single runs, no interval"
    return f"Cost against `{BASELINE_KV}` at {cost_max_model_len:,}: " + "; ".join(parts) + f" ({source})."


def deployment_cost(spec: str, max_model_len: int, evidence: schema.Evidence) -> schema.DeploymentCost | None:
    """The deployed spec's cost at its deployed max_model_len; None when neither figure was measured there."""
    throughput = throughput_costs(spec, max_model_len, evidence.throughput)
    ttft = ttft_costs(spec, max_model_len, evidence.speed)
    if not throughput and not ttft:
        return None
    return schema.DeploymentCost(max_model_len=max_model_len, throughput=throughput, ttft=ttft,
                                 line=cost_line(max_model_len, throughput, ttft))
