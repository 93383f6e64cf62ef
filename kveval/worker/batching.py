"""Submit many requests as batches and still know which one vLLM refused (issue 18).

vLLM validates every request of a `LLM.generate` call before it runs any of them, and refuses the whole
call when one prompt is too long (it aborts the requests it had added). So a batch is submitted
whole; a refused batch is split in two and each half tried again, until the refusal sits on a request
alone, which is then submitted by itself so its record carries vLLM's own words. Refusals cost only
validation, and every accepted request runs exactly once, batched with its neighbours.

Requests that may not fit (`might_refuse`: for vLLM, a prompt of max_model_len tokens or more) are submitted alone
from the start, so one long acceptance-test prompt does not split the batch of the others. That is a
scheduling choice only: vLLM decides each request's fate either way.

The batches a request ends up in depend only on the requests and on which of them vLLM refuses, so two
cells of the same max_model_len (fp8 and auto) get the same batch composition: their greedy outputs stay
comparable.
"""
from __future__ import annotations

from typing import Callable, Sequence, TypeVar

Request = TypeVar("Request")
Result = TypeVar("Result")


def submit_in_batches(requests: Sequence[Request], run_batch: Callable[[list[Request]], list[Result]],
                      run_one: Callable[[Request], Result],
                      might_refuse: Callable[[Request], bool]) -> list[Result]:
    """Results in the order of `requests`. `run_batch` raises when the engine refuses the batch;
    `run_one` records a refusal instead of raising."""
    results: dict[int, Result] = {}
    alone = [i for i, request in enumerate(requests) if might_refuse(request)]
    for i in alone:
        results[i] = run_one(requests[i])
    together = [i for i in range(len(requests)) if i not in set(alone)]
    _bisect(together, requests, run_batch, run_one, results)
    return [results[i] for i in range(len(requests))]


def _bisect(indices: list[int], requests, run_batch, run_one, results: dict) -> None:
    if not indices:
        return
    if len(indices) == 1:
        results[indices[0]] = run_one(requests[indices[0]])
        return
    try:
        outputs = run_batch([requests[i] for i in indices])
    except Exception:  # noqa: BLE001 - a refusal in the batch: find it by halves
        middle = len(indices) // 2
        _bisect(indices[:middle], requests, run_batch, run_one, results)
        _bisect(indices[middle:], requests, run_batch, run_one, results)
        return
    results.update(zip(indices, outputs))
