"""The review's run section: command, model, prompt format, FP8 scales, cells, engine options,
versions, hardware, trust_remote_code, rounds of more evidence. Pure: manifest and evidence in,
markdown out.
"""
from __future__ import annotations

from kveval.files import schema
from kveval.render.markdown import escape_cell, fmt_int


def run_section(manifest: dict, evidence: schema.Evidence) -> str:
    versions = manifest.get("versions", {})
    hardware = manifest.get("hardware", {})
    options = manifest.get("options", {})
    stored = [cell for cell in evidence.cells.values() if not cell.missing]
    started = sum(1 for cell in stored if cell.started)
    planned = len(manifest.get("cells", []))
    missing = planned - len(stored)
    lines = [
        "## Run",
        "",
        f"- **Command:** `{manifest.get('command', '').replace('`', '')}`",
        f"- **Model:** {escape_cell(manifest.get('model', {}).get('path'), None)} "
        f"({escape_cell(manifest.get('model', {}).get('source'), None)})",
        _prompt_format_line(manifest.get("prompt_format")),
        _kv_scales_line(manifest),
        f"- **Cells:** {planned} planned (KV dtype {', '.join(options.get('kv', []))} × max_model_len "
        f"{', '.join(str(x) for x in options.get('max_model_len', []))}); {started} started"
        + (f"; **{missing} have no result yet** (run interrupted?)" if missing > 0 else ""),
        f"- **Engine options:** KV budget "
        f"{fmt_int(options.get('kv_cache_memory_bytes')) + ' bytes' if options.get('kv_cache_memory_bytes') else 'vLLM default'}"
        f", gpu_memory_utilization {options.get('gpu_memory_utilization') or 'vLLM default'}"
        f", enforce_eager {options.get('enforce_eager')}, seed {options.get('seed')}, suite `{options.get('suite')}`"
        + (f", extra {escape_cell(options.get('engine_args'), None)}" if options.get("engine_args") else "")
        + (f" ({options['kv_budget_note']})" if options.get("kv_budget_note") else ""),
        f"- **Versions:** kveval {versions.get('kveval')}, vLLM {versions.get('vllm')} "
        f"({versions.get('vllm_distribution')}), torch {versions.get('torch')}, transformers {versions.get('transformers')}",
        f"- **Hardware:** {escape_cell(hardware.get('cpu'), None)}, {hardware.get('cores')} cores, "
        f"{hardware.get('memory_gib')} GiB"
        + (f"; GPUs: {escape_cell('; '.join(hardware.get('gpus')), None)}" if hardware.get("gpus") else "; no GPU")
        + (f"; CPU flags: {' '.join(hardware.get('cpu_flags', []))}" if not hardware.get("gpus") else ""),
        _remote_code_line(options),
        _rounds_line(manifest.get("task_rounds")),
        f"- **Created:** {manifest.get('created')}",
    ]
    return "\n".join(line for line in lines if line is not None)


def _rounds_line(record: dict | None) -> str | None:
    """What the rounds of more evidence did (run/rounds.py) and why they stopped; None without rounds."""
    if not record:
        return None
    rounds = record.get("rounds") or []
    done = []
    for entry in rounds:
        parts = []
        task_cells = [c for c in (entry.get("task_cells") if entry.get("task_cells") is not None
                                  else entry.get("cells") or [])[1:]]
        if task_cells:
            parts.append(f"task samples for {', '.join(task_cells)} (aiming at {entry.get('target')} paired)")
        probe_cells = (entry.get("probe_cells") or [])[1:]
        if probe_cells:
            parts.append(f"{(entry.get('probes') or {}).get('count')} new probes for {', '.join(probe_cells)}")
        done.append(f"round {entry['round']} at {entry['max_model_len']}: {'; '.join(parts)}")
    budget = (record.get("budget") or {}).get("text")
    head = f"- **Rounds of more evidence** (`--budget {budget}`): " if budget else "- **Rounds of more evidence:** "
    body = ("; ".join(done) + ". ") if done else "none. "
    return head + body + f"Stopped: {record.get('stopped') or 'still running'}."


def _remote_code_line(options: dict) -> str | None:
    """Said only when it was on: the checkpoint's own Python code ran inside the engines."""
    value = (options.get("engine_args") or {}).get("trust_remote_code")
    if value in (True, "true", "True", 1, "1"):
        return ("- **trust_remote_code: on** (--engine-arg trust_remote_code=true): the model's own Python code ran "
                "in every engine; kveval keeps it off unless asked")
    return None


def _kv_scales_line(manifest: dict) -> str | None:
    scales = manifest.get("kv_scales")
    if not scales:
        return None
    line = ("- **FP8 scales:** calibrated, from the checkpoint (" + str(scales.get("source")) + ")"
            if scales.get("calibrated") else "- **FP8 scales:** none in the checkpoint: vLLM runs the FP8 cache at "
                                             "scale 1.0 (values beyond ±448 saturate)")
    if manifest.get("baseline_engine_dtype"):
        line += (f"; vLLM would resolve `auto` to FP8 for this checkpoint, so the `auto` baseline cells run "
                 f"kv_cache_dtype={manifest['baseline_engine_dtype']} (the model dtype)")
    return line


def _prompt_format_line(fmt: dict | None) -> str | None:
    if not fmt:
        return None  # runs made before kveval recorded it
    if fmt.get("chat_template"):
        return "- **Prompts:** the model's chat template applied (token ids exactly as vLLM's chat path makes them)"
    bos = "adds" if fmt.get("adds_bos") else "does **not** add"
    return (f"- **Prompts:** plain text — the model has no chat template; its tokenizer {bos} a BOS token "
            f"({escape_cell(fmt.get('bos_token'), None) or 'none'}). A base model's answers to questions are often "
            "poor or loop on every cell alike; judge FP8 by the differences, not the answers.")
