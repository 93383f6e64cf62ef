"""Greedy generation of every workload prompt, one request at a time.

Submitting prompts one by one is what makes acceptance honest: vLLM refuses a too-long prompt for
the whole batch, so a batch would hide which prompt it was. Each refusal is stored with vLLM's own
message; the prompt is never truncated and never predicted to fail.
"""
from __future__ import annotations


def run(engine, cell) -> dict:
    records = []
    total = len(cell.prompts)
    for index, prompt in enumerate(cell.prompts):
        cell.emit(event="step", phase="generation", done=index, total=total, item=prompt.id)
        result = engine.generate(list(prompt.token_ids), prompt.max_tokens)
        records.append({"prompt_id": prompt.id, "workload": prompt.workload, **result})
    cell.emit(event="step", phase="generation", done=total, total=total)
    return {
        "sampling": {"temperature": 0.0, "seed": engine.settings.seed, "one_request_at_a_time": True},
        "records": records,
    }
