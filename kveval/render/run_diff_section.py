"""`kveval diff`'s markdown: what changed from run A to run B (analysis/run_diff.RunDiff), judged
against each run's noise. Pure: the diff in, markdown out."""
from __future__ import annotations

import pandas as pd

from kveval.analysis.run_diff import Change, RunDiff
from kveval.render.markdown import bullet, escape_cell, fmt_int, fmt_sig, table

MAX_SPEED_ROWS = 40


def _pair(change: Change, fmt=fmt_sig) -> str:
    a, b = fmt(change.a) or "–", fmt(change.b) or "–"
    return a if change.a == change.b and change.a is not None else f"{a} → {b}"


def _share(value) -> str:
    return "" if value is None else f"{100 * value:.1f} %"


def _judgement(change: Change, other_text: bool = False, points: bool = False) -> str:
    if change.delta is None:
        return ""
    delta = f"{100 * change.delta:+.1f} pts" if points else f"{change.delta:+.3g}"
    if change.beyond_noise is None:
        return f"{delta} (other text: not judged)" if other_text else delta
    mark = "**worse**" if change.harmful else ("beyond noise" if change.beyond_noise else "within noise")
    return f"{delta} ({mark})"


def _basis(divergence) -> str:
    if divergence.basis != "common sequences":
        return ""
    return f" (on {divergence.sequences_common} common of {divergence.sequences_a}/{divergence.sequences_b} sequences)"


def _verdict(cell) -> str:
    a, b = cell.verdict_a or "–", cell.verdict_b or "–"
    if a == b:
        return a
    return f"{a} → {b}" + (" **worse**" if cell.verdict_change == "worse" else "")


def _tasks(cell) -> tuple[str, str]:
    tasks = cell.tasks
    if tasks is None:
        return "", ""
    accuracy = tasks.accuracy
    shown = " → ".join(f"{_share(value)} (n {n})" if value is not None else "–"
                       for value, n in ((accuracy.a, tasks.n_a), (accuracy.b, tasks.n_b)))
    if tasks.ci_low is None:
        return shown, ""
    mark = "**worse**" if accuracy.harmful else ("beyond noise" if accuracy.beyond_noise else "within noise")
    return shown, f"{100 * accuracy.delta:+.1f} pts [{100 * tasks.ci_low:+.1f}, {100 * tasks.ci_high:+.1f}] ({mark})"


def _pool(cell) -> str:
    pool = cell.pool
    if pool is None or (pool.tokens_a is None and pool.tokens_b is None):
        return ""
    text = f"{fmt_int(pool.tokens_a) or '–'} → {fmt_int(pool.tokens_b) or '–'}"
    return text + (f" (×{pool.ratio:.2f})" if pool.ratio is not None and pool.tokens_a != pool.tokens_b else "")


def _cells_table(diff: RunDiff) -> pd.DataFrame:
    rows = []
    for cell in diff.cells:
        d = cell.divergence
        tasks, task_change = _tasks(cell)
        rows.append({
            "cell": cell.cell, "verdict A → B": _verdict(cell),
            "KL mean A → B": (_pair(d.kl_mean) + _basis(d)) if d else "",
            "Δ KL": _judgement(d.kl_mean, d.basis == "other text") if d else "",
            "top-1 A → B": _pair(d.top1_agreement, _share) if d else "",
            "Δ top-1": _judgement(d.top1_agreement, d.basis == "other text", points=True) if d else "",
            "task accuracy A → B": tasks, "Δ task accuracy (95 % CI)": task_change,
            "KV pool tokens A → B": _pool(cell),
        })
    return pd.DataFrame(rows)


def _settings_table(diff: RunDiff) -> pd.DataFrame:
    return pd.DataFrame([{"": s.name, "A": s.a or "", "B": s.b or "", "changed": "yes" if s.changed else ""}
                         for s in diff.settings if s.a or s.b])


def _ratio(change: Change) -> str:
    return f"×{change.b / change.a:.2f}" if change.a and change.b is not None else ""


def _speed_table(diff: RunDiff) -> pd.DataFrame:
    return pd.DataFrame([{
        "cell": s.cell, "workload": s.workload,
        "decode tok/s A → B": _pair(s.decode_tok_s, lambda v: "" if v is None else f"{v:,.1f}"),
        "decode B/A": _ratio(s.decode_tok_s), "decode vs spread": s.decode_vs_spread,
        "TTFT ms A → B": _pair(s.ttft_ms, lambda v: "" if v is None else f"{v:,.1f}"),
        "TTFT B/A": _ratio(s.ttft_ms), "TTFT vs spread": s.ttft_vs_spread,
    } for s in diff.speed[:MAX_SPEED_ROWS]])


def _throughput_table(diff: RunDiff) -> pd.DataFrame:
    return pd.DataFrame([{
        "cell": t.cell, "concurrency": t.concurrency,
        "output tok/s A → B": _pair(t.output_tok_s, lambda v: "" if v is None else f"{v:,.1f}"),
        "B/A": _ratio(t.output_tok_s),
        "requests/s A → B": _pair(t.requests_per_s, lambda v: "" if v is None else f"{v:,.2f}"),
    } for t in diff.throughput[:MAX_SPEED_ROWS]])


def _changed_recommendation(diff: RunDiff) -> str:
    names = [row.name for row in diff.recommendation if row.changed]
    return f"**The recommendation changed** ({', '.join(names)})" if names else ""


def _headline(diff: RunDiff) -> str:
    changed = _changed_recommendation(diff)
    if diff.worse:
        return (f"**B got worse than A** in {len(diff.worse_cells)} of {len(diff.cells)} matched "
                f"cell{'s' if len(diff.cells) != 1 else ''}: {', '.join(diff.worse_cells)}."
                + (f" {changed}." if changed else ""))
    if not diff.cells:
        return ((f"{changed}; " if changed else "")
                + "**No cell in common**: A and B tested no cell with the same KV spec and max_model_len.")
    matched = f"{len(diff.cells)} matched cell{'s' if len(diff.cells) != 1 else ''}"
    if changed:   # "Nothing got worse" alone would hide a new deploy line or exit code
        return f"{changed}; no verdict of the {matched} rose and no change beyond noise is harmful."
    return f"**Nothing got worse** in {matched} (no verdict rose, no harmful change beyond noise)."


def _recommendation_lines(diff: RunDiff) -> list[str]:
    """Each changed part of the recommendation, A → B (code spans: the commands are pasted)."""
    return [bullet(f"{row.name}: `{row.a or '–'}` → `{row.b or '–'}`") for row in diff.recommendation if row.changed]


def run_diff_markdown(diff: RunDiff) -> str:
    """The whole `kveval diff` report as markdown."""
    out = [f"# kveval diff: {escape_cell(diff.a.model, None)}", "",
           f"A: `{diff.a.path}` — B: `{diff.b.path}`", "", _headline(diff), ""]
    for cell in diff.cells:
        if cell.worse:
            out.append(bullet(f"{cell.cell}: " + "; ".join(cell.why_worse)))
    out += _recommendation_lines(diff)
    if diff.worse or diff.recommendation_changed:
        out.append("")
    out += ["## Cells", ""]
    out += [table(_cells_table(diff)) if diff.cells else "_(no cell in both runs)_", ""]
    for name, side in (("A", diff.only_in_a), ("B", diff.only_in_b)):
        if side:
            out.append(f"Only in {name}: " + ", ".join(f"{c.cell} ({c.verdict or 'no verdict'})" for c in side) + ".")
    if diff.only_in_a or diff.only_in_b:
        out.append("")
    changed = [c for c in diff.cells if c.reasons_new or c.reasons_gone]
    for cell in changed:
        parts = ([f"new in B: {', '.join(cell.reasons_new)}"] if cell.reasons_new else []) + \
                ([f"gone in B: {', '.join(cell.reasons_gone)}"] if cell.reasons_gone else [])
        out.append(bullet(f"{cell.cell} reason codes — {'; '.join(parts)}"))
    if changed:
        out.append("")
    out += ["## Runs", "", table(_settings_table(diff)), ""]
    out += ["## Speed (concurrency 1)", "", table(_speed_table(diff)) if diff.speed else
            "_(no cell and workload measured in both runs)_", ""]
    out += ["## Throughput", "", table(_throughput_table(diff)) if diff.throughput else
            "_(no cell and concurrency measured in both runs)_", ""]
    out += ["## How changes are judged", "",
            f"KL noise used: {fmt_sig(diff.kl_noise_threshold)} nats (A's floor {fmt_sig(diff.a.noise_kl_mean) or 'none'}, "
            f"B's {fmt_sig(diff.b.noise_kl_mean) or 'none'}). {diff.rule}", ""]
    out += [bullet(f"Note: {note}") for note in diff.notes]
    return "\n".join(out).rstrip() + "\n"
