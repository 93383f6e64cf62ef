"""review.md from stored results (pure: manifest, workloads and cell dicts in, markdown out)."""
from __future__ import annotations

import pandas as pd

from .analysis.acceptance import acceptance_matrix, rejections
from .analysis.capacity import pool_by_length, startup_table
from .analysis.cells import BASELINE_KV
from .analysis.identity import identity_pairs, identity_summary
from .analysis.speed import speed_table
from .markdown import escape_cell, fmt_float, fmt_int, fmt_pct, table


def render_review(manifest: dict, workloads: list[dict], cells: dict[str, dict]) -> str:
    sections = [
        _header(manifest, cells),
        _startup_section(cells),
        _acceptance_section(workloads, cells),
        _speed_section(cells),
        _identity_section(workloads, cells),
        _samples_section(workloads, cells),
        _footer(manifest),
    ]
    return "\n\n".join(s for s in sections if s).rstrip() + "\n"


def _header(manifest: dict, cells: dict[str, dict]) -> str:
    versions = manifest.get("versions", {})
    hardware = manifest.get("hardware", {})
    options = manifest.get("options", {})
    started = sum(1 for f in cells.values() if f.get("started"))
    planned = len(manifest.get("cells", []))
    missing = planned - len(cells)
    lines = [
        f"# kveval review — {escape_cell(manifest.get('model', {}).get('name'), None)}",
        "",
        f"- **Command:** `{manifest.get('command', '').replace('`', '')}`",
        f"- **Model:** {escape_cell(manifest.get('model', {}).get('path'), None)} "
        f"({escape_cell(manifest.get('model', {}).get('source'), None)})",
        f"- **Cells:** {planned} planned (KV dtype {', '.join(options.get('kv', []))} × max_model_len "
        f"{', '.join(str(x) for x in options.get('max_model_len', []))}); {started} started"
        + (f"; **{missing} have no result yet** (run interrupted?)" if missing > 0 else ""),
        f"- **Engine options:** KV budget "
        f"{fmt_int(options.get('kv_cache_memory_bytes')) + ' bytes' if options.get('kv_cache_memory_bytes') else 'vLLM default'}"
        f", gpu_memory_utilization {options.get('gpu_memory_utilization') or 'vLLM default'}"
        f", enforce_eager {options.get('enforce_eager')}, seed {options.get('seed')}, suite `{options.get('suite')}`"
        + (f", extra {escape_cell(options.get('engine_args'), None)}" if options.get("engine_args") else ""),
        f"- **Versions:** kveval {versions.get('kveval')}, vLLM {versions.get('vllm')} "
        f"({versions.get('vllm_distribution')}), torch {versions.get('torch')}, transformers {versions.get('transformers')}",
        f"- **Hardware:** {escape_cell(hardware.get('cpu'), None)}, {hardware.get('cores')} cores, "
        f"{hardware.get('memory_gib')} GiB"
        + (f"; GPUs: {escape_cell('; '.join(hardware.get('gpus')), None)}" if hardware.get("gpus") else "; no GPU")
        + (f"; CPU flags: {' '.join(hardware.get('cpu_flags', []))}" if not hardware.get("gpus") else ""),
        f"- **Created:** {manifest.get('created')}",
    ]
    return "\n".join(lines)


def _startup_section(cells: dict[str, dict]) -> str:
    out = ["## Start-up and KV pool", ""]
    pools = pool_by_length(cells)
    if not pools.empty:
        view = pd.DataFrame({
            "max_model_len": pools.max_model_len.map(fmt_int),
            "KV dtype": pools.kv_cache_dtype.fillna(""),
            f"{BASELINE_KV} pool tokens": pools.baseline_pool_tokens.map(fmt_int),
            "pool tokens": pools.pool_tokens.map(fmt_int),
            f"ratio vs {BASELINE_KV}": pools.ratio.map(lambda r: f"{r:.2f}×" if r is not None and not pd.isna(r) else ""),
            "did not start": pools.not_started,
        })
        out += [table(view), ""]
        fallback = pools[pools.fallback_ratio.notna()]
        for row in fallback.itertuples():
            out.append(f"- At max_model_len {row.max_model_len:,} a cell did not start, but its pool is known from "
                       f"{row.fallback_sources}: {BASELINE_KV} {fmt_int(row.baseline_fallback_tokens)} vs "
                       f"{row.kv_cache_dtype} {fmt_int(row.fallback_tokens)} tokens ({row.fallback_ratio:.2f}×).")
        if not fallback.empty:
            out.append("")
    startup = startup_table(cells)
    view = pd.DataFrame({
        "cell": startup.cell,
        "started": startup.started.map(lambda s: "yes" if s else "**no**"),
        "start-up s": startup.startup_s.map(lambda v: fmt_float(v, 1)),
        "KV pool tokens": startup.kv_pool_tokens.map(fmt_int),
        "max concurrency": startup.max_concurrency.map(lambda v: fmt_float(v, 2) + "×" if fmt_float(v) else ""),
        "backend": startup.attention_backend.fillna(""),
        "reason": startup.reason.fillna(""),
        "vLLM estimated max length": startup.estimated_max_model_len.map(fmt_int),
    })
    out += [table(view)]
    failed = startup[~startup.started]
    if not failed.empty:
        out += ["", "Why cells did not start, in vLLM's own words:", ""]
        for (reason, message), group in failed.groupby(["reason", "message"], sort=False, dropna=False):
            out.append(f"- **{', '.join(group.cell)}** — `{reason}`: {escape_cell(message, 600)}")
    crashed = startup[startup.crash.notna()]
    for row in crashed.itertuples():
        out.append(f"- **{row.cell}** started, then its process died: {escape_cell(row.crash, 300)} "
                   "(phases finished before the crash are kept)")
    return "\n".join(out)


def _acceptance_section(workloads: list[dict], cells: dict[str, dict]) -> str:
    matrix = acceptance_matrix(workloads, cells)
    if matrix.empty:
        return ""
    started = [name for name, facts in cells.items() if facts.get("started")]
    symbols = {"accepted": "✓", "rejected": "✗ rejected", "error": "⚠ error", "not run": "—", "not started": ""}
    view = matrix[["prompt", "prompt_tokens", *started]].copy()
    view["prompt_tokens"] = view.prompt_tokens.map(fmt_int)
    for name in started:
        view[name] = view[name].map(symbols.get)
    out = ["## Prompt acceptance", "",
           "Every prompt was submitted to every started cell; ✗ means the engine refused it "
           "(nothing is predicted or truncated).", "", table(view)]
    refused = rejections({n: cells[n] for n in started})
    if not refused.empty:
        out += ["", "Engine messages (the first refusal of each cell; every message is in the cell files):", ""]
        for cell, group in refused.groupby("cell", sort=False):
            first = group.iloc[0]
            others = f" (+{len(group) - 1} more: {', '.join(group.prompt.iloc[1:])})" if len(group) > 1 else ""
            out.append(f"- {cell} / {first.prompt} ({first.kind}){others}: {escape_cell(first.message, 400)}")
    return "\n".join(out)


def _speed_section(cells: dict[str, dict]) -> str:
    speed = speed_table(cells)
    if speed.empty:
        return ""
    measured = speed[speed.runs > 0]
    view = pd.DataFrame({
        "workload": measured.workload,
        "cell": measured.cell,
        "prompt tokens": measured.prompt_tokens.map(fmt_int),
        "runs": measured.runs,
        "TTFT ms (median)": measured.ttft_ms.map(lambda v: fmt_float(v, 1)),
        "TTFT range": [f"{fmt_float(a, 1)}–{fmt_float(b, 1)}" for a, b in zip(measured.ttft_ms_min, measured.ttft_ms_max)],
        f"Δ TTFT vs {BASELINE_KV}": measured.ttft_delta_pct.map(fmt_pct),
        "decode tok/s (median)": measured.decode_tok_s.map(lambda v: fmt_float(v, 1)),
        "decode range": [f"{fmt_float(a, 1)}–{fmt_float(b, 1)}"
                         for a, b in zip(measured.decode_tok_s_min, measured.decode_tok_s_max)],
        f"Δ decode vs {BASELINE_KV}": measured.decode_delta_pct.map(fmt_pct),
    })
    first = next(iter(cells.values()))
    options = (first.get("engine_settings") or {})
    return "\n".join([
        "## Speed (concurrency 1)", "",
        "TTFT and decode tok/s from vLLM's per-request stats; each run decodes exactly the stated number of tokens. "
        "Median over the measured runs after warm-up; Δ is against the `auto` cell at the same max_model_len.",
        "" if options.get("enforce_eager") is None else f"enforce_eager: {options.get('enforce_eager')}.",
        "", table(view),
    ])


def _identity_section(workloads: list[dict], cells: dict[str, dict]) -> str:
    pairs = identity_pairs(workloads, cells)
    out = ["## Output identity vs `auto`", "",
           "Greedy outputs compared token by token with the `auto` cell at the same max_model_len."]
    if pairs.empty:
        out += ["", "_No pair to compare: a non-`auto` cell and its `auto` baseline must both have started._"]
        return "\n".join(out)
    summary = identity_summary(pairs)
    view = pd.DataFrame({
        "workload": summary.workload, "cell": summary.cell, "vs": summary.baseline,
        "identical": [f"{int(i)}/{int(c)}" for i, c in zip(summary.identical, summary.compared)],
        "earliest divergent token": summary.earliest_divergence.map(fmt_int),
    })
    total, same = len(pairs), int(pairs.identical.sum())
    out += ["", f"**{same} of {total}** outputs identical.", "", table(view)]
    return "\n".join(out)


def _samples_section(workloads: list[dict], cells: dict[str, dict]) -> str:
    """The first short prompt's answer in every started cell, escaped, so a reader sees the text."""
    from .analysis.cells import generation_records

    first = next((w for w in workloads if w.get("kind") == "short"), None)
    if first is None:
        return ""
    rows = []
    for name, facts in cells.items():
        record = generation_records(facts).get(first["id"])
        if record and record.get("accepted"):
            rows.append({"cell": name, "tokens": record.get("output_tokens"), "finish": record.get("finish_reason"),
                         "output (start)": _shorten(record.get("text") or "", 240)})
    if not rows:
        return ""
    return "\n".join([f"## Sample outputs — `{first['id']}`", "", table(pd.DataFrame(rows), untrusted=("output (start)",))])


def _shorten(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _footer(manifest: dict) -> str:
    return ("---\nGenerated by kveval from the stored run directory; `kveval report DIR` re-renders it without "
            "an engine. Per-cell facts: `cells/<cell>.json`; vLLM's own logs: `cells/<cell>.log`.")
