"""lm-eval's view of a cell: an `lm_eval` `LM` that runs every request on the engine the cell
already started, so a task costs no second engine start, and that records every request.

lm-eval's own vLLM and HF models left-truncate a prompt that does not fit and only warn. This one
never truncates: a request whose prompt plus answer budget does not fit the cell's max_model_len
is recorded as rejected (as in the acceptance matrix), lm-eval gets an empty answer for it, and
kveval's statistics leave it out of accuracy instead of counting a truncated prompt.

Prompts are rendered like every other kveval prompt (`workloads.render_chat`: the chat template
when the model has one, with the run's --chat-template-kwargs that the tokenizer carries, else plain
text with BOS), so task samples were sized with the very token count the engine sees.
"""
from __future__ import annotations

import time
from typing import Any, Callable

from lm_eval.api.model import LM
from pydantic import BaseModel, ConfigDict

from kveval.inputs.workloads import encode, render_chat
from kveval.worker.engine_results import Generated, Scored

DEFAULT_MAX_GEN_TOKS = 256  # lm-eval's own default when a task does not say


class _GenerationKwargs(BaseModel):
    """What kveval reads of a generate_until request's generation settings (lm-eval's `gen_kwargs`):
    where to stop and the answer budget. Sampling settings are ignored: kveval's answers are greedy."""

    model_config = ConfigDict(extra="ignore")

    until: Any = None           # a string or a list of strings
    max_gen_toks: Any = None


class EngineLM(LM):
    def __init__(self, engine, tokenizer, max_model_len: int,
                 on_request: Callable[[dict], None] | None = None):
        super().__init__()
        self.engine = engine
        self.tokenizer = tokenizer
        self.max_model_len = int(max_model_len)
        self.on_request = on_request or (lambda record: None)
        self.records: list[dict[str, Any]] = []
        # Accepted generation requests of every task, for the phase's efficiency reference.
        self.accepted_generations: list[tuple[list[int], int, list[str]]] = []

    # -- generation tasks --------------------------------------------------------------------
    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """Samples that fit are generated together in one batch (vLLM's continuous batching: every
        cell gets the same batch, so fp8 and auto stay comparable); those that do not are rejected."""
        records, batch = [], []
        for request in requests:
            context, gen_kwargs = request.args
            settings = _GenerationKwargs.model_validate(dict(gen_kwargs or {}))
            until = settings.until or []
            until = [until] if isinstance(until, str) else list(until)
            max_gen = int(settings.max_gen_toks or DEFAULT_MAX_GEN_TOKS)
            _, ids = render_chat(self.tokenizer, context)
            record = self._new_record(request, "generate_until", len(ids), max_gen)
            if len(ids) + max_gen > self.max_model_len:
                record.update(self._too_long(len(ids), max_gen), response="")
            else:
                batch.append((record, (ids, max_gen, until)))
            records.append(record)
        results = self.engine.generate_batch([job for _, job in batch])
        for (record, job), result in zip(batch, map(Generated.model_validate, results)):
            record.update(accepted=result.accepted, rejection=result.rejection, error=result.error,
                          response=result.text or "", finish_reason=result.finish_reason,
                          output_tokens=result.output_tokens, seconds=result.wall_seconds)
            if result.accepted:
                self.accepted_generations.append(job)
        for record in records:
            self._keep(record)
        return [record["response"] for record in records]

    # -- likelihood tasks (multiple choice etc.), for lm-eval built-ins given with --task --------
    def loglikelihood(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        """Requests that fit are scored together in one batch (worker/batching.py finds a refusal);
        those that do not are rejected without being submitted."""
        answers: list[tuple[float, bool]] = [(float("-inf"), False)] * len(requests)
        records, batch = [], []
        for index, request in enumerate(requests):
            context, continuation = request.args
            context_ids, continuation_ids = self._encode_pair(context, continuation)
            ids = context_ids + continuation_ids
            record = self._new_record(request, "loglikelihood", len(ids), 0)
            if len(ids) >= self.max_model_len or not continuation_ids:
                record.update(self._too_long(len(ids), 0) if continuation_ids else
                              {"accepted": False, "rejection": None, "error": "empty continuation"})
            else:
                batch.append((index, record, ids, len(context_ids)))
            records.append(record)
        began = time.perf_counter()
        scored_all = self.engine.score([ids for _, _, ids, _ in batch], top_k=1) if batch else []
        share = (time.perf_counter() - began) / max(1, len(batch))
        for (index, record, _, context_length), scored in zip(batch, map(Scored.model_validate, scored_all)):
            record["seconds"] = share
            if not scored.accepted:
                record.update(accepted=False, rejection=scored.rejection, error=scored.error)
                continue
            # positions[j] is about token j+1; the continuation starts at token context_length.
            positions = scored.positions[context_length - 1:]
            logprob = sum(p["logprob"] for p in positions)
            greedy = all(p["top"] and p["top"][0][0] == p["token"] for p in positions)
            record.update(accepted=True, rejection=None, error=None, response=f"logprob {logprob:.4f}")
            answers[index] = (logprob, greedy)
        for record in records:
            self._keep(record)
        return answers

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        raise NotImplementedError("kveval runs generation and log-likelihood (multiple-choice) tasks; "
                                  "rolling log-likelihood (perplexity) tasks are not supported")

    # -- helpers -----------------------------------------------------------------------------
    def _encode_pair(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        """lm-eval's convention: trailing spaces of the context belong to the continuation; the
        continuation's tokens are those the joined text adds after the context's."""
        spaces = len(context) - len(context.rstrip())
        if spaces:
            context, continuation = context[:-spaces], context[-spaces:] + continuation
        whole = encode(self.tokenizer, context + continuation, add_special_tokens=True)
        context_ids = encode(self.tokenizer, context, add_special_tokens=True)
        if not context:  # nothing to condition on: BOS or EOS stands in, as in lm-eval
            start = getattr(self.tokenizer, "bos_token_id", None) or self.tokenizer.eos_token_id
            return [start], encode(self.tokenizer, continuation)
        return context_ids, whole[len(context_ids):]

    def _too_long(self, prompt_tokens: int, budget: int) -> dict:
        return {"accepted": False, "error": None,
                "rejection": f"kveval: prompt of {prompt_tokens} tokens + answer budget of {budget} does not fit "
                             f"max_model_len {self.max_model_len}; not truncated, not submitted"}

    @staticmethod
    def _new_record(request, kind: str, prompt_tokens: int, max_gen: int) -> dict:
        return {"task": request.task_name, "doc_id": request.doc_id, "request": kind,
                "prompt_tokens": prompt_tokens, "max_gen_toks": max_gen, "accepted": None,
                "rejection": None, "error": None, "response": "", "finish_reason": None,
                "output_tokens": None, "seconds": None}

    def _keep(self, record: dict) -> None:
        self.records.append(record)
        self.on_request(record)

    @property
    def tokenizer_name(self) -> str:
        return str(getattr(self.tokenizer, "name_or_path", "kveval"))
