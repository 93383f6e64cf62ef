"""The built-in prompt sets: short questions, degeneration probes, context prompts of exact sizes and
over-limit prompts, planned from the run's max_model_lens and counts (`build_workloads`)."""
from __future__ import annotations

import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from kveval.inputs.resources import DATA_DIR
from kveval.inputs.workloads.chat import context_frame, decode, render_chat
from kveval.inputs.workloads.documents import DocumentStream, load_corpus
from kveval.inputs.workloads.records import PromptFileError, PromptSpec
from kveval.inputs.workloads.user_prompts import read_jsonl, user_prompt_specs

# The built-in suite, shaped like a published field study of FP8 KV cache.
SHORT_WORKLOADS = {"short_256": 256, "short_512": 512}     # name -> max_tokens
CTX_1K_TOKENS = 1000
CTX_MAX_TOKENS = 256
OVER_LIMIT_MAX_TOKENS = 64
# Degeneration probes: short questions from data/probes.jsonl, generated together in one batch. A
# paired test of loops needs outputs by the hundred (issue 22: 9 outputs have no power), and short
# answers in one batch cost little next to the tasks.
PROBE_WORKLOAD = "probe"
PROBE_MAX_TOKENS = 256
# Keys are valid `counts` keys: "ctx_pct" covers every ctx_*pct workload, "over" every over_L.
DEFAULT_COUNTS = {"short_256": 3, "short_512": 2, "probe": 100, "ctx_1k": 2, "ctx_pct": 1, "over": 1}
DEFAULT_CONTEXT_FRACTIONS = (0.25, 0.90)

MIN_MAX_MODEL_LEN = 64
MIN_DOCUMENT_TOKENS = 16   # a context prompt must hold at least this much document

# Asked after the document; each prompt of a context workload gets a different one.
CONTEXT_QUESTIONS = (
    "Summarise the text above in five sentences.",
    "What are the main points made in the text above?",
    "List three facts stated in the text above and explain why each one matters.",
    "Explain the text above to a curious twelve-year-old.",
    "Write a short set of study notes covering the text above.",
)
# Short, so over_L prompts fit even the smallest allowed max_model_len.
OVER_LIMIT_QUESTION = "Summarise the text above."


def load_questions(data_dir: Path = DATA_DIR, name: str = "questions.jsonl") -> list[str]:
    """The `question` of every line of data/questions.jsonl (or data/probes.jsonl), in file order."""
    path = Path(data_dir) / name
    questions = []
    for lineno, obj in read_jsonl(path):
        q = obj.get("question")
        if not isinstance(q, str) or not q.strip():
            raise PromptFileError(path, lineno, "'question' must be a non-empty string")
        questions.append(q)
    if not questions:
        raise PromptFileError(path, None, "no questions in file")
    return questions



@dataclass(frozen=True)
class _Workload:
    name: str
    kind: str
    max_tokens: int
    count: int
    target_tokens: int | None = None
    group: str | None = None   # "ctx_pct" / "over": a counts key that sets the whole group


def _fraction_name(fraction: float) -> str:
    return f"ctx_{round(fraction * 100)}pct"


def _check_max_model_lens(max_model_lens: Sequence[int]) -> list[int]:
    lens = list(max_model_lens)
    if not lens:
        raise ValueError("max_model_lens is empty; give at least one max_model_len")
    for length in lens:
        if isinstance(length, bool) or not isinstance(length, int):
            raise ValueError(f"max_model_lens must be integers, got {length!r}")
        if length < MIN_MAX_MODEL_LEN:
            raise ValueError(f"max_model_len {length} is too small; "
                             f"the minimum is {MIN_MAX_MODEL_LEN}")
    return sorted(set(lens))


def _plan(lens: list[int], context_fractions: Sequence[float],
          counts: Mapping[str, int] | None, context_basis: int | None = None) -> list[_Workload]:
    """The built-in workloads with their final counts (zero-count workloads dropped)."""
    # Context prompts are sized against the largest length a cell can actually have: a
    # max_model_len above the model's own limit never starts, so sizing to it tests nothing.
    largest = min(lens[-1], context_basis) if context_basis else lens[-1]
    plan = [_Workload(name, "short", max_tokens, DEFAULT_COUNTS[name])
            for name, max_tokens in SHORT_WORKLOADS.items()]
    plan.append(_Workload(PROBE_WORKLOAD, "probe", PROBE_MAX_TOKENS, DEFAULT_COUNTS[PROBE_WORKLOAD]))
    # A 1k prompt is only useful if at least the largest cell accepts it (vLLM refuses
    # prompt_len >= max_model_len), so it is left out of suites whose cells are all too small.
    ctx_1k_fits = CTX_1K_TOKENS < largest
    if ctx_1k_fits:
        plan.append(_Workload("ctx_1k", "context", CTX_MAX_TOKENS, DEFAULT_COUNTS["ctx_1k"],
                              CTX_1K_TOKENS))
    for fraction in context_fractions:
        if not 0 < fraction < 1:
            raise ValueError(f"context fraction {fraction!r} must be between 0 and 1 (exclusive)")
        target = math.floor(fraction * largest + 1e-9)   # guard against 0.9 * L = x.99999
        plan.append(_Workload(_fraction_name(fraction), "context", CTX_MAX_TOKENS,
                              DEFAULT_COUNTS["ctx_pct"], target, group="ctx_pct"))
    for length in lens:
        # One token over the limit: the cell with this max_model_len must refuse it.
        plan.append(_Workload(f"over_{length}", "over_limit", OVER_LIMIT_MAX_TOKENS,
                              DEFAULT_COUNTS["over"], length + 1, group="over"))

    names = [w.name for w in plan]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"context fractions give duplicate workload names: {duplicates}")

    counts = dict(counts or {})
    for key, value in counts.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"count for {key!r} must be an integer >= 0, got {value!r}")
    known = set(names) | {"ctx_pct", "over"}
    if not ctx_1k_fits and counts.get("ctx_1k", 0) > 0:
        raise ValueError(f"ctx_1k needs a max_model_len above {CTX_1K_TOKENS}; "
                         f"the largest given is {largest}")
    unknown = sorted(set(counts) - known - {"ctx_1k"})
    if unknown:
        raise ValueError(f"unknown workload names in counts: {unknown}; "
                         f"known: {sorted(known)}")

    def final_count(w: _Workload) -> int:
        if w.name in counts:                  # an exact name wins over its group key
            return counts[w.name]
        if w.group in counts:
            return counts[w.group]
        return w.count

    planned = [_Workload(w.name, w.kind, w.max_tokens, final_count(w), w.target_tokens, w.group)
               for w in plan]
    return [w for w in planned if w.count > 0]


def _short_prompts(tokenizer, workloads: list[_Workload], data_dir: Path,
                   seed: int) -> list[PromptSpec]:
    """Short chat questions. short_256 takes questions from the front of a seeded shuffle and
    short_512 from the back, so the two never share a question and changing one workload's count
    does not change the other's prompts."""
    if not workloads:
        return []
    questions = load_questions(data_dir)
    random.Random(f"{seed}:questions").shuffle(questions)
    total = sum(w.count for w in workloads)
    if total > len(questions):
        raise ValueError(f"short workloads ask for {total} questions but "
                         f"{Path(data_dir) / 'questions.jsonl'} has only {len(questions)}")
    from_front = next(iter(SHORT_WORKLOADS))   # short_256; the other one reads from the back
    return [prompt for w in workloads
            for prompt in _question_prompts(tokenizer, w, questions[:w.count] if w.name == from_front
                                            else questions[::-1][:w.count])]


def _question_prompts(tokenizer, w: _Workload, questions: list) -> list[PromptSpec]:
    """One chat prompt per question, named `<workload>-<i>`."""
    prompts = []
    for i, question in enumerate(questions):
        _, ids = render_chat(tokenizer, question)
        prompts.append(PromptSpec(f"{w.name}-{i}", w.name, w.kind, decode(tokenizer, ids),
                                  tuple(ids), w.max_tokens, None))
    return prompts


def _probe_prompts(tokenizer, workloads: list[_Workload], data_dir: Path,
                   seed: int) -> list[PromptSpec]:
    """Degeneration probes: the first `count` questions of a seeded shuffle of data/probes.jsonl."""
    if not workloads:
        return []
    [w] = workloads
    questions = load_questions(data_dir, "probes.jsonl")
    if w.count > len(questions):
        raise ValueError(f"the probe workload asks for {w.count} questions but "
                         f"{Path(data_dir) / 'probes.jsonl'} has only {len(questions)}")
    random.Random(f"{seed}:probes").shuffle(questions)
    return _question_prompts(tokenizer, w, questions[:w.count])


def _context_prompts(tokenizer, workloads: list[_Workload], data_dir: Path,
                     seed: int) -> list[PromptSpec]:
    """Document + question prompts of exactly target_tokens tokens (ctx_* and over_*)."""
    if not workloads:
        return []
    stream = DocumentStream(tokenizer, load_corpus(data_dir), seed)
    frames: dict[str, tuple[list[int], list[int]]] = {}
    prompts = []
    for w in workloads:
        # Per-workload generator: adding or dropping one workload leaves the others unchanged.
        rng = random.Random(f"{seed}:{w.name}")
        first_paragraph = rng.randrange(stream.paragraphs_per_pass)
        stride = max(1, stream.paragraphs_per_pass // w.count)   # spread slices over the corpus
        first_question = rng.randrange(len(CONTEXT_QUESTIONS))
        for i in range(w.count):
            question = (OVER_LIMIT_QUESTION if w.kind == "over_limit"
                        else CONTEXT_QUESTIONS[(first_question + i) % len(CONTEXT_QUESTIONS)])
            if question not in frames:
                frames[question] = context_frame(tokenizer, question)
            prefix, suffix = frames[question]
            overhead = len(prefix) + len(suffix)
            n_document = w.target_tokens - overhead
            if n_document < MIN_DOCUMENT_TOKENS:
                raise ValueError(
                    f"workload {w.name}: target of {w.target_tokens} tokens is too small; it must "
                    f"be at least the prompt overhead ({overhead} tokens) + {MIN_DOCUMENT_TOKENS}")
            ids = prefix + stream.take(first_paragraph + i * stride, n_document) + suffix
            assert len(ids) == w.target_tokens
            prompts.append(PromptSpec(f"{w.name}-{i}", w.name, w.kind, decode(tokenizer, ids),
                                      tuple(ids), w.max_tokens, w.target_tokens))
    return prompts


def build_workloads(tokenizer, max_model_lens: Sequence[int], *, seed: int = 0,
                    data_dir: Path = DATA_DIR, counts: Mapping[str, int] | None = None,
                    user_prompts: Sequence[Mapping[str, Any]] = (),
                    context_fractions: Sequence[float] = DEFAULT_CONTEXT_FRACTIONS,
                    context_basis: int | None = None) -> list[PromptSpec]:
    """All prompts for one run, in a fixed order: short, context, over-limit, user.

    Built-in workloads (default counts in DEFAULT_COUNTS):
      short_256 / short_512   questions from data/questions.jsonl, max_tokens 256 / 512;
      probe                   100 questions from data/probes.jsonl, max_tokens 256, generated in one
                              batch: the outputs the degeneration test counts;
      ctx_1k                  exactly 1000 tokens (only if the largest max_model_len is above it);
      ctx_{f*100}pct          exactly floor(f * largest max_model_len) tokens, per context fraction
                              (largest capped at `context_basis`, e.g. the model's own limit);
      over_{L}                exactly L + 1 tokens for every distinct L, max_tokens 64.
    `counts` overrides counts by workload name, or by group: "ctx_pct" sets every ctx_*pct and
    "over" every over_L (an exact name wins over its group). A count of 0 drops the workload.
    `user_prompts` are dicts as in a --prompts file (see load_user_prompts); kind "user".
    """
    lens = _check_max_model_lens(max_model_lens)
    data_dir = Path(data_dir)
    plan = _plan(lens, context_fractions, counts, context_basis)
    prompts = _short_prompts(tokenizer, [w for w in plan if w.kind == "short"], data_dir, seed)
    prompts += _probe_prompts(tokenizer, [w for w in plan if w.kind == "probe"], data_dir, seed)
    prompts += _context_prompts(tokenizer, [w for w in plan if w.kind not in ("short", "probe")], data_dir, seed)
    all_builtin = [w.name for w in _plan(lens, context_fractions, None, context_basis)] + ["ctx_pct", "over"]
    prompts += user_prompt_specs(tokenizer, user_prompts, all_builtin)

    seen: set[str] = set()
    for p in prompts:
        if p.id in seen:
            raise ValueError(f"duplicate prompt id {p.id!r} (user prompt ids must not repeat "
                             f"built-in ids)")
        seen.add(p.id)
    return prompts

