"""Greedy generation of every workload prompt and degeneration probe.

All prompts go to the engine as one batch, so vLLM's scheduler batches them (issue 18); a prompt vLLM
refuses still ends alone with vLLM's own message (worker/batching.py): acceptance stays honest, and no
prompt is truncated or predicted to fail. The batch composition depends only on the prompts and their
refusals, so cells of the same max_model_len get the same batches and their greedy outputs compare.
"""
from __future__ import annotations

from kveval.files import schema
from kveval.worker import efficiency


def run(engine, cell) -> schema.GenerationPhase:
    prompts = list(cell.prompts)
    total = len(prompts)
    cell.emit(event="step", phase="generation", done=0, total=total, item=f"{total} prompts in one batch")
    requests = [(list(p.token_ids), p.max_tokens, None) for p in prompts]
    finished = 0

    def report(n: int) -> None:
        # Each finished request is a step: a slow but moving batch is not taken for a stalled engine.
        nonlocal finished
        finished += n
        cell.emit(event="step", phase="generation", done=finished, total=total, item="requests finished")

    results = engine.generate_batch(requests, on_finished=report)
    # The engine's plain result, under the prompt it answers: the cell file's record as stored.
    records = [schema.GenerationRecord(prompt_id=p.id, workload=p.workload, **result) for p, result in zip(prompts, results)]
    cell.emit(event="step", phase="generation", done=total, total=total)
    accepted = [request for request, record in zip(requests, records) if record.accepted]
    sampling = schema.Sampling(temperature=0.0, seed=engine.settings.seed, one_request_at_a_time=False, in_one_batch=total)
    measured = efficiency.measure(engine, "generate", accepted, cell.options.efficiency_sample if cell.options else 0)
    if measured:
        return schema.GenerationPhase(sampling=sampling, records=records, efficiency=measured)
    return schema.GenerationPhase(sampling=sampling, records=records)
