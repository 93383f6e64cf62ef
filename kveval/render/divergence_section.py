"""The review's teacher-forced divergence section: KL, top-1 agreement and |Δp| per comparison (KV
dtype and noise rows, the noise floor), then per token-position bucket. Pure: evidence in, markdown
out.
"""
from __future__ import annotations

import pandas as pd

from kveval.analysis.cell_records import BASELINE_KV
from kveval.files import schema
from kveval.files.rundir import RunDir
from kveval.render.divergence_plot import NOISE_KINDS
from kveval.render.markdown import escape_cell, fmt_int, fmt_share, fmt_sig, long_table


_KIND_LABELS = {"kv": "KV dtype", "noise_batch": "noise: another batch", "noise_length": "noise: another max_model_len"}


def _figures(s: schema.DivergenceSummary) -> dict:
    return _shown(n=s.n, kl_mean=s.kl_mean, kl_median=s.kl_median, kl_p90=s.kl_p90, kl_p99=s.kl_p99, kl_max=s.kl_max,
                  top1=s.top1_agreement, top1_se=s.top1_agreement_se, abs_dp_mean=s.abs_dp_mean,
                  abs_dp_p99=s.abs_dp_p99)


def _shown(n=None, kl_mean=None, kl_median=None, kl_p90=None, kl_p99=None, kl_max=None, top1=None, top1_se=None,
           abs_dp_mean=None, abs_dp_p99=None) -> dict:
    se = f" ± {100 * top1_se:.1f}" if top1_se is not None else ""
    return {"n": fmt_int(n), "KL mean": fmt_sig(kl_mean), "KL median": fmt_sig(kl_median),
            "KL p90": fmt_sig(kl_p90), "KL p99": fmt_sig(kl_p99), "KL max": fmt_sig(kl_max),
            "top-1 agreement": fmt_share(top1) + se,
            "|Δp| mean": fmt_sig(abs_dp_mean), "|Δp| p99": fmt_sig(abs_dp_p99)}


def _sequences(comp: schema.Comparison) -> str:
    """How many scored sequences the gate's intervals rest on, and how many reach the late half."""
    clustered = comp.clustered or {}
    if "kl_mean" not in clustered:
        return ""
    late = clustered.get("kl_late_mean")
    return f"{clustered['kl_mean'].clusters} ({late.clusters if late else 0})"


def _comparison_label(comp: schema.Comparison) -> str:
    return comp.cell if comp.kind == "noise_batch" else f"{comp.cell} vs {comp.reference}"


def _divergence_table(divergence: schema.Divergence) -> str:
    rows = [{"comparison": _comparison_label(c), "kind": _KIND_LABELS.get(c.kind, c.kind), **_figures(c.summary),
             "sequences (late)": _sequences(c)}
            for c in divergence.comparisons]
    floor = divergence.noise_floor
    if floor:
        disagreement = floor.top1_disagreement
        rows.append({"comparison": "**noise floor** (worst noise row)", "kind": "noise",
                     **_shown(kl_mean=floor.kl_mean, kl_p99=floor.kl_p99,
                              top1=None if disagreement is None else 1 - disagreement)})
    return long_table(pd.DataFrame(rows), f"{len(divergence.comparisons)} comparisons")


def _bucket_table(divergence: schema.Divergence) -> str:
    rows = []
    for comp in divergence.comparisons:
        for bucket in comp.buckets:
            rows.append({"comparison": _comparison_label(comp), "kind": _KIND_LABELS.get(comp.kind, comp.kind),
                         "positions": bucket.bucket, **_figures(bucket)})
    compared = sum(1 for comp in divergence.comparisons if comp.buckets)
    return long_table(pd.DataFrame(rows), f"{len(rows)} rows: each position bucket of {compared} comparisons")


def _top_k_text(top_k: list) -> str:
    return f"k={', '.join(str(k) for k in top_k)}" if top_k else "k unknown: no cell scored"


def divergence_section(evidence: schema.Evidence) -> str:
    divergence = evidence.divergence
    out = ["## Teacher-forced divergence", "",
           "Every cell scored the same token sequences (the reference cell's greedy continuations and plain documents) "
           "with prompt logprobs, so each position compares two next-token distributions over the same history. "
           f"KL(`{BASELINE_KV}` ‖ cell) in nats, over the reference top-k ({_top_k_text(divergence.top_k)}) plus "
           "a rest bucket: a lower bound on the full-vocabulary KL. Top-1 agreement: positions with the same most "
           "likely token (± 1 s.e. over positions, in points; the gate's bounds count sequences, the last column, as units: "
           "positions of one document are not independent); |Δp|: change in the probability of the actual next token. Noise rows "
           f"compare `{BASELINE_KV}` with itself; the noise floor beside the KV rows is what no KV change looks like here."]
    if divergence.comparisons:
        out += ["", _divergence_table(divergence)]
    else:
        out += ["", "_No comparison: a non-`auto` cell and an `auto` cell must both have started and scored._"]
    notes = []
    for entry in divergence.unmatched:
        notes.append(f"- {entry.cell}: not compared ({escape_cell(entry.reason, 200)})")
    for comp in divergence.comparisons:
        if comp.kind == "kv" and comp.same_length is False:
            notes.append(f"- {comp.cell}: no `{BASELINE_KV}` cell started at its max_model_len; compared with "
                       f"{comp.reference} on the sequences both scored.")
    if notes:
        out += ["", *notes]
    if any(c.buckets for c in divergence.comparisons):
        out += ["", "### By position", "", "The same figures per absolute token-position bucket.", "",
                _bucket_table(divergence)]
        if any(c.buckets and c.kind not in NOISE_KINDS for c in divergence.comparisons):
            out += ["", f"![KL and top-1 agreement by token position]({RunDir.KL_POSITION_PLOT})"]
    return "\n".join(out)
