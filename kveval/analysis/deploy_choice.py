"""Which passing configuration to deploy (issue 41): weigh the KV it frees against what it costs.

- `capacity` (the default, the rule before issue 41): the largest pool against `auto`.
- `throughput`: the best output tok/s × auto, the geometric mean over the concurrency levels measured at the
  length it would be deployed with (a configuration that frees KV but runs slower loses to one that does not).
- `latency`: the smallest TTFT × auto, the geometric mean over the speed workloads there.
- `--slo` (inputs/slo.py), when given, comes first: the configuration with the most goodput, the requests/s
  of the highest concurrency level that meets every objective (vLLM bench's goodput, at a percentile).
A configuration without the figure a preference needs ranks after those with it; ties fall back to the
capacity order (larger pool, fewer kept layers, the checkpoint's own scales). Pure: rows in, a choice out.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from kveval.analysis.cell_records import BASELINE_KV
from kveval.analysis.deploy_cost import throughput_costs, ttft_costs
from kveval.files import schema
from kveval.inputs.slo import SloTarget

_COLUMN = {"ttft": "ttft_ms_p", "tpot": "itl_ms_p"}   # the throughput table's per-request percentiles


@dataclass
class Choice:
    configuration: str | None
    goodput: list[schema.Goodput] = field(default_factory=list)   # with an SLO: every candidate's
    notes: list[str] = field(default_factory=list)


def _geometric_mean(values: list[float]) -> float | None:
    clean = [v for v in values if v and v > 0]
    return math.exp(sum(math.log(v) for v in clean) / len(clean)) if clean else None


def throughput_score(spec: str, max_model_len: int, evidence: schema.Evidence) -> float | None:
    return _geometric_mean([c.ratio for c in throughput_costs(spec, max_model_len, evidence.throughput)])


def latency_score(spec: str, max_model_len: int, evidence: schema.Evidence) -> float | None:
    return _geometric_mean([c.ratio for c in ttft_costs(spec, max_model_len, evidence.speed)])


def meets(row: schema.ThroughputRow, targets: Sequence[SloTarget]) -> bool:
    """The level's pooled percentile is within every objective (and the level ran)."""
    if row.error or row.output_tok_s is None:
        return False
    for target in targets:
        value = getattr(row, f"{_COLUMN[target.metric]}{target.percentile}", None)
        if value is None or (isinstance(value, float) and math.isnan(value)) or value > target.seconds * 1000.0:
            return False
    return True


def goodput(spec: str, max_model_len: int, rows: list[schema.ThroughputRow] | None,
            targets: Sequence[SloTarget]) -> schema.Goodput:
    """Requests/s at the highest level of `spec` at `max_model_len` that meets every objective."""
    mine = sorted((r for r in rows or [] if r.kv_spec == spec and r.max_model_len == max_model_len and meets(r, targets)),
                  key=lambda r: r.concurrency or 0)
    best = mine[-1] if mine else None
    return schema.Goodput(configuration=spec, concurrency=int(best.concurrency) if best and best.concurrency is not None else None,
                          requests_per_s=best.requests_per_s if best else None)


def choose(candidates: list[str], capacity_key: Callable[[str], tuple[Any, ...]], cap_of: Callable[[str], int],
           evidence: schema.Evidence, prefer: str = "capacity", targets: Sequence[SloTarget] = ()) -> Choice:
    """The configuration to deploy among `candidates` (passing ones), by SLO goodput, then preference,
    then capacity. `cap_of(spec)`: the max_model_len it would be deployed with."""
    if not candidates:
        return Choice(None)
    by_preference = _ordered(candidates, capacity_key, cap_of, evidence, prefer)
    if not targets:
        return Choice(by_preference[0], notes=_preference_note(by_preference[0], candidates, capacity_key, cap_of,
                                                               evidence, prefer))
    rates = {spec: goodput(spec, cap_of(spec), evidence.throughput, targets) for spec in candidates}
    slo_text = " ".join(t.text for t in targets)
    meeting = [spec for spec in by_preference if rates[spec].requests_per_s]
    notes = []
    if meeting:
        chosen = max(meeting, key=lambda spec: (rates[spec].requests_per_s, -by_preference.index(spec)))
        best = rates[chosen]
        notes.append(f"Chosen for --slo {slo_text}: {best.requests_per_s:.2f} requests/s meet it at concurrency "
                     f"{best.concurrency} (the most goodput among passing configurations at the deployed length).")
    else:
        chosen = by_preference[0]
        notes.append(f"No passing configuration meets --slo {slo_text} at any concurrency level measured at its "
                     f"deployed length; chosen by --prefer {prefer} instead.")
    baseline = goodput(BASELINE_KV, cap_of(chosen), evidence.throughput, targets)
    if baseline.requests_per_s and (rates[chosen].requests_per_s or 0) < baseline.requests_per_s:
        notes.append(f"`{BASELINE_KV}` meets it with more goodput ({baseline.requests_per_s:.2f} requests/s at "
                     f"concurrency {baseline.concurrency}): under this SLO FP8 buys capacity, not goodput.")
    return Choice(chosen, [rates[spec] for spec in candidates], notes)


_FIGURE = {"throughput": ("output tok/s", throughput_score), "latency": ("TTFT", latency_score)}


def _preference_note(chosen: str, candidates: list[str], capacity_key: Callable[[str], tuple[Any, ...]],
                     cap_of: Callable[[str], int], evidence: schema.Evidence, prefer: str) -> list[str]:
    """One line where the preference picked another configuration than the most KV would have."""
    roomiest = max(candidates, key=capacity_key)
    if prefer not in _FIGURE or chosen == roomiest:
        return []
    figure, score = _FIGURE[prefer]
    mine, theirs = score(chosen, cap_of(chosen), evidence), score(roomiest, cap_of(roomiest), evidence)
    if mine is None or theirs is None:
        return []
    return [f"Chosen by --prefer {prefer}: {figure} {mine:.2f}× `{BASELINE_KV}` (geometric mean over what was "
            f"measured) against {theirs:.2f}× for `{roomiest}`, which holds more KV."]


def _ordered(candidates: list[str], capacity_key: Callable[[str], tuple[Any, ...]], cap_of: Callable[[str], int],
             evidence: schema.Evidence, prefer: str) -> list[str]:
    """Candidates best first by the preference; those missing its figure after, each group by capacity."""
    by_capacity = sorted(candidates, key=capacity_key, reverse=True)
    if prefer == "capacity":
        return by_capacity
    score = throughput_score if prefer == "throughput" else latency_score
    sign = 1.0 if prefer == "throughput" else -1.0   # more throughput is better, less TTFT is
    scored = {spec: score(spec, cap_of(spec), evidence) for spec in candidates}
    known = {spec: value for spec, value in scored.items() if value is not None}
    best_first = sorted((s for s in by_capacity if s in known), key=lambda s: -sign * known[s])  # stable
    return best_first + [s for s in by_capacity if s not in known]
