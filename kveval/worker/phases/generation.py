"""Greedy generation of every workload prompt.

Workload prompts go one request at a time: that is what makes acceptance honest, since vLLM refuses a
too-long prompt for the whole batch, so a batch would hide which prompt it was. Each refusal is stored
with vLLM's own message; the prompt is never truncated and never predicted to fail. The degeneration
probes (short questions, kind "probe") are generated together in one batch: there are a hundred of
them, they all fit, and if vLLM refuses the batch `Engine.generate_batch` retries them one by one.
"""
from __future__ import annotations


def run(engine, cell) -> dict:
    single = [p for p in cell.prompts if p.kind != "probe"]
    probes = [p for p in cell.prompts if p.kind == "probe"]
    total = len(cell.prompts)
    records = []
    for index, prompt in enumerate(single):
        cell.emit(event="step", phase="generation", done=index, total=total, item=prompt.id)
        result = engine.generate(list(prompt.token_ids), prompt.max_tokens)
        records.append({"prompt_id": prompt.id, "workload": prompt.workload, **result})
    if probes:
        cell.emit(event="step", phase="generation", done=len(single), total=total, item=f"{len(probes)} probes")
        results = engine.generate_batch([(list(p.token_ids), p.max_tokens, None) for p in probes])
        records += [{"prompt_id": p.id, "workload": p.workload, **result} for p, result in zip(probes, results)]
    cell.emit(event="step", phase="generation", done=total, total=total)
    return {
        "sampling": {"temperature": 0.0, "seed": engine.settings.seed, "one_request_at_a_time": True,
                     **({"probes_in_one_batch": len(probes)} if probes else {})},
        "records": records,
    }
