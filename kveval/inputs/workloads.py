"""Prompt construction: the built-in workload suite and user prompt files.

Everything here is pure and deterministic: given the same tokenizer, max_model_lens, seed, data
directory, counts and user prompts, `build_workloads` returns the same prompts, token for token.
Every cell of the (KV-cache dtype x max_model_len) grid receives exactly these token ids, so the
comparison between cells is not blurred by prompt differences.

Only the stdlib is imported. The tokenizer is duck-typed as a Hugging Face tokenizer:
`tokenizer(text_or_list, add_special_tokens=...)["input_ids"]`, `tokenizer.decode(ids, ...)`,
`tokenizer.apply_chat_template(...)` and the `chat_template` attribute. The run's chat-template
arguments (--chat-template-kwargs) travel with the tokenizer: `with_chat_template_kwargs`.

`PromptSpec.token_ids` is what engines must be given (as a token prompt). `PromptSpec.text` is
`tokenizer.decode(token_ids)` for humans and reports; re-tokenising it is not guaranteed to give
the same ids, because context prompts are cut out of a token stream at exact token counts.
"""
from __future__ import annotations

import json
import math
import random
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from kveval.inputs.resources import DATA_DIR

# The built-in suite, shaped like a published field study of FP8 KV cache.
SHORT_WORKLOADS = {"short_256": 256, "short_512": 512}     # name -> max_tokens
CTX_1K_TOKENS = 1000
CTX_MAX_TOKENS = 256
OVER_LIMIT_MAX_TOKENS = 64
USER_MAX_TOKENS = 256
USER_WORKLOAD = "user"
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

# Stands where the document goes while the chat template is rendered; never appears in real text.
_PLACEHOLDER = "\u27e6KVEVAL-DOCUMENT\u27e7"
_USER_KEYS = {"id", "name", "prompt", "messages", "max_tokens", "workload"}
_WORKLOAD_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


# --------------------------------------------------------------------------- prompt records

@dataclass(frozen=True)
class PromptSpec:
    id: str                      # unique, stable: f"{workload}-{index}" unless a user file names it
    workload: str                # group name, e.g. "short_256", "ctx_90pct", "over_4096", "user"
    kind: str                    # "short" | "probe" | "context" | "over_limit" | "user"
    text: str                    # tokenizer.decode(token_ids), special tokens kept
    token_ids: tuple[int, ...]   # what the engine gets
    max_tokens: int
    target_tokens: int | None    # prompt size asked for; None for short and user prompts

    def __post_init__(self) -> None:
        # Accept lists (e.g. from JSON) but store a tuple so the record stays hashable/immutable.
        object.__setattr__(self, "token_ids", tuple(int(t) for t in self.token_ids))

    def to_dict(self) -> dict:
        d = asdict(self)
        d["token_ids"] = list(self.token_ids)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "PromptSpec":
        required = ("id", "workload", "kind", "text", "token_ids", "max_tokens")
        missing = [k for k in required if k not in d]
        if missing:
            raise ValueError(f"PromptSpec.from_dict: missing keys {missing}")
        return cls(
            id=d["id"], workload=d["workload"], kind=d["kind"], text=d["text"],
            token_ids=tuple(d["token_ids"]), max_tokens=int(d["max_tokens"]),
            target_tokens=d.get("target_tokens"),
        )


class PromptFileError(ValueError):
    """A prompt file (or in-memory prompt list) is invalid; the message names file and line."""

    def __init__(self, path: str | Path, line: int | None, reason: str):
        self.path = str(path)
        self.line = line
        self.reason = reason
        where = f"{self.path}:{line}" if line is not None else self.path
        super().__init__(f"{where}: {reason}")


# --------------------------------------------------------------------------- tokenisation

def _has_chat_template(tokenizer) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def _encode(tokenizer, text: str, add_special_tokens: bool = False) -> list[int]:
    if not text and not add_special_tokens:
        return []
    return list(tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"])


def _decode(tokenizer, ids: Sequence[int]) -> str:
    # Keep special tokens (they are part of what the model sees) and do not "clean up" spaces.
    return tokenizer.decode(list(ids), skip_special_tokens=False,
                            clean_up_tokenization_spaces=False)


class ChatTemplateTokenizer:
    """A tokenizer whose every chat rendering passes the run's chat-template arguments (`kveval compare
    --chat-template-kwargs`, vLLM's `chat_template_kwargs`), e.g. {"enable_thinking": false} for a
    thinking template. Everything else is the wrapped tokenizer's, so the parent's prompts, its task data
    and the worker's lm-eval prompts (worker/lmeval_lm) all render through `_apply_template` alike."""

    def __init__(self, tokenizer, chat_template_kwargs: Mapping[str, Any]):
        self.tokenizer = tokenizer
        self.chat_template_kwargs = dict(chat_template_kwargs)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name == "tokenizer":   # copy/pickle probe before __init__: no recursion
            raise AttributeError(name)
        return getattr(self.tokenizer, name)

    def __call__(self, *args, **kwargs):
        return self.tokenizer(*args, **kwargs)

    def apply_chat_template(self, conversation, **kwargs):
        return self.tokenizer.apply_chat_template(conversation, **{**self.chat_template_kwargs, **kwargs})


def with_chat_template_kwargs(tokenizer, chat_template_kwargs: Mapping[str, Any] | None):
    """`tokenizer`, rendering chats with these template arguments (in place of any it had); the bare
    tokenizer when there are none."""
    if isinstance(tokenizer, ChatTemplateTokenizer):
        tokenizer = tokenizer.tokenizer
    return ChatTemplateTokenizer(tokenizer, chat_template_kwargs) if chat_template_kwargs else tokenizer


def _apply_template(tokenizer, messages: list[dict]) -> str:
    # A ChatTemplateTokenizer adds the run's chat-template arguments (with_chat_template_kwargs).
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def render_messages(tokenizer, messages: Sequence[Mapping[str, str]]) -> tuple[str, list[int]]:
    """Render a conversation the way vLLM's chat path does and return (text, token ids).

    With a chat template: apply it (generation prompt added) and tokenise WITHOUT adding special
    tokens, because the template already contains them. Without one, only a single user message
    makes sense: it is used as a plain prompt, tokenised WITH special tokens (e.g. BOS).
    """
    messages = [{"role": m["role"], "content": m["content"]} for m in messages]
    if _has_chat_template(tokenizer):
        text = _apply_template(tokenizer, messages)
        return text, _encode(tokenizer, text)
    if len(messages) != 1 or messages[0]["role"] != "user":
        raise ValueError("the tokenizer has no chat template, so only a single user message "
                         "(or a plain 'prompt') can be used")
    text = messages[0]["content"]
    return text, _encode(tokenizer, text, add_special_tokens=True)


def render_chat(tokenizer, user_text: str) -> tuple[str, list[int]]:
    """(text, token ids) for one user turn; see `render_messages` for the rule."""
    return render_messages(tokenizer, [{"role": "user", "content": user_text}])


def _special_tokens_around(tokenizer) -> tuple[list[int], list[int]]:
    """Tokens that add_special_tokens=True puts before and after plain text (e.g. [BOS], [])."""
    plain = _encode(tokenizer, "a")
    full = _encode(tokenizer, "a", add_special_tokens=True)
    for start in range(len(full) - len(plain) + 1):
        if full[start:start + len(plain)] == plain:
            return full[:start], full[start + len(plain):]
    return full[:len(full) - len(plain)], []   # odd tokenizer: assume everything extra leads


def _context_frame(tokenizer, question: str) -> tuple[list[int], list[int]]:
    """Token ids that go before and after the document in a "<document>\\n\\n<question>" turn.

    The template is rendered once with a placeholder where the document goes, and the two sides
    are tokenised separately, so the document can then be given an exact number of tokens.
    """
    user_text = f"{_PLACEHOLDER}\n\n{question}"
    if _has_chat_template(tokenizer):
        rendered = _apply_template(tokenizer, [{"role": "user", "content": user_text}])
        if rendered.count(_PLACEHOLDER) != 1:
            raise ValueError("the chat template altered or repeated the user message; "
                             "cannot place a document in it")
        prefix, suffix = rendered.split(_PLACEHOLDER)
        return _encode(tokenizer, prefix), _encode(tokenizer, suffix)
    head, tail = _special_tokens_around(tokenizer)
    prefix, suffix = user_text.split(_PLACEHOLDER)
    return head + _encode(tokenizer, prefix), _encode(tokenizer, suffix) + tail


# --------------------------------------------------------------------------- source data

def load_corpus(data_dir: Path = DATA_DIR) -> list[str]:
    """Paragraphs of data/corpus/*.txt, files in name order, paragraphs split on blank lines."""
    files = sorted((Path(data_dir) / "corpus").glob("*.txt"))
    paragraphs = []
    for f in files:
        for block in re.split(r"\n\s*\n", f.read_text(encoding="utf-8")):
            para = " ".join(block.split())   # unwrap hard line breaks inside a paragraph
            if para:
                paragraphs.append(para)
    if not paragraphs:
        raise ValueError(f"no corpus paragraphs found in {Path(data_dir) / 'corpus'}/*.txt")
    return paragraphs


def load_questions(data_dir: Path = DATA_DIR, name: str = "questions.jsonl") -> list[str]:
    """The `question` of every line of data/questions.jsonl (or data/probes.jsonl), in file order."""
    path = Path(data_dir) / name
    questions = []
    for lineno, obj in _read_jsonl(path):
        q = obj.get("question")
        if not isinstance(q, str) or not q.strip():
            raise PromptFileError(path, lineno, "'question' must be a non-empty string")
        questions.append(q)
    if not questions:
        raise PromptFileError(path, None, "no questions in file")
    return questions


def _separator_ids(tokenizer) -> list[int]:
    """Tokens of the blank line between two paragraphs, as they come out in running text.

    Byte-level BPE tokenisers often encode a lone "\n\n" as one token but "end.\n\nNext" with
    two "\n" tokens; using the in-context form keeps decode -> re-encode close to the stream.
    """
    left, right = _encode(tokenizer, "end."), _encode(tokenizer, "Next")
    joint = _encode(tokenizer, "end.\n\nNext")
    middle = joint[len(left):len(joint) - len(right)]
    if joint[:len(left)] == left and joint[len(joint) - len(right):] == right and middle:
        return middle
    return _encode(tokenizer, "\n\n")


class _DocumentStream:
    """An endless token stream over the corpus, for cutting documents of any length.

    Paragraphs are tokenised once, then laid out in an order shuffled by random.Random(seed),
    reshuffled on every pass (so 32K+ token documents do not repeat one fixed sequence), each
    followed by the tokens of a blank line. Documents start at paragraph boundaries, which keeps
    their beginnings readable; they end wherever the exact token count runs out.
    """

    def __init__(self, tokenizer, paragraphs: Sequence[str], seed: int):
        self._paragraph_ids = [list(ids) for ids in
                               tokenizer(list(paragraphs), add_special_tokens=False)["input_ids"]]
        self._separator = _separator_ids(tokenizer)
        self._rng = random.Random(seed)
        self._tokens: list[int] = []
        self._paragraph_starts: list[int] = []   # stream offset of each laid-out paragraph
        self._last: int | None = None

    @property
    def paragraphs_per_pass(self) -> int:
        return len(self._paragraph_ids)

    def _lay_out_one_pass(self) -> None:
        order = list(range(len(self._paragraph_ids)))
        self._rng.shuffle(order)
        if len(order) > 1 and order[0] == self._last:   # no paragraph twice in a row across passes
            order[0], order[-1] = order[-1], order[0]
        for i in order:
            self._paragraph_starts.append(len(self._tokens))
            self._tokens.extend(self._paragraph_ids[i])
            self._tokens.extend(self._separator)
        self._last = order[-1]

    def take(self, paragraph: int, n_tokens: int) -> list[int]:
        """n_tokens tokens starting at the beginning of the paragraph-th laid-out paragraph."""
        while len(self._paragraph_starts) <= paragraph:
            self._lay_out_one_pass()
        start = self._paragraph_starts[paragraph]
        while len(self._tokens) < start + n_tokens:
            self._lay_out_one_pass()
        return self._tokens[start:start + n_tokens]


def document_tokens(tokenizer, n_tokens: int, *, seed: int = 0, data_dir: Path = DATA_DIR) -> list[int]:
    """Exactly n_tokens of plain corpus text (no chat template), for teacher-forced scoring.

    Starts with the tokenizer's own special prefix (e.g. BOS) when it adds one to plain text, so
    the model sees a normal document start.
    """
    prefix = [t for t in _encode(tokenizer, "x", add_special_tokens=True) if t not in _encode(tokenizer, "x")]
    stream = _DocumentStream(tokenizer, load_corpus(Path(data_dir)), seed)
    first = random.Random(f"{seed}:document:{n_tokens}").randrange(stream.paragraphs_per_pass)
    body = stream.take(first, max(0, n_tokens - len(prefix)))
    return (prefix + body)[:n_tokens]


# --------------------------------------------------------------------------- the suite

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
    prompts = []
    for w in workloads:
        picked = questions[:w.count] if w.name == from_front else questions[::-1][:w.count]
        for i, question in enumerate(picked):
            _, ids = render_chat(tokenizer, question)
            prompts.append(PromptSpec(f"{w.name}-{i}", w.name, w.kind, _decode(tokenizer, ids),
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
    prompts = []
    for i, question in enumerate(questions[:w.count]):
        _, ids = render_chat(tokenizer, question)
        prompts.append(PromptSpec(f"{w.name}-{i}", w.name, w.kind, _decode(tokenizer, ids),
                                  tuple(ids), w.max_tokens, None))
    return prompts


# Later rounds of degeneration evidence (run/rounds.py) draw new probes from here, never from probes.jsonl,
# so the first look stays what it was and no round repeats a question.
ROUND_PROBES_FILE = "probes_rounds.jsonl"


def round_probe_pool_size(data_dir: Path = DATA_DIR) -> int:
    """How many questions later rounds can draw from, all rounds together."""
    return len(load_questions(data_dir, ROUND_PROBES_FILE))


def round_probe_prompts(tokenizer, round_number: int, start: int, count: int, *, seed: int = 0,
                        data_dir: Path = DATA_DIR) -> list[PromptSpec]:
    """Round `round_number`'s probes: questions start .. start+count of a seeded shuffle of
    data/probes_rounds.jsonl (each round starts where the one before stopped), ids probe-r<k>-<i>,
    rendered and capped like the first look's probes. Fewer when the pool runs out."""
    questions = load_questions(data_dir, ROUND_PROBES_FILE)
    random.Random(f"{seed}:round-probes").shuffle(questions)
    prompts = []
    for i, question in enumerate(questions[start:start + count]):
        _, ids = render_chat(tokenizer, question)
        prompts.append(PromptSpec(f"{PROBE_WORKLOAD}-r{round_number}-{i}", PROBE_WORKLOAD, "probe",
                                  _decode(tokenizer, ids), tuple(ids), PROBE_MAX_TOKENS, None))
    return prompts


def _context_prompts(tokenizer, workloads: list[_Workload], data_dir: Path,
                     seed: int) -> list[PromptSpec]:
    """Document + question prompts of exactly target_tokens tokens (ctx_* and over_*)."""
    if not workloads:
        return []
    stream = _DocumentStream(tokenizer, load_corpus(data_dir), seed)
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
                frames[question] = _context_frame(tokenizer, question)
            prefix, suffix = frames[question]
            overhead = len(prefix) + len(suffix)
            n_document = w.target_tokens - overhead
            if n_document < MIN_DOCUMENT_TOKENS:
                raise ValueError(
                    f"workload {w.name}: target of {w.target_tokens} tokens is too small; it must "
                    f"be at least the prompt overhead ({overhead} tokens) + {MIN_DOCUMENT_TOKENS}")
            ids = prefix + stream.take(first_paragraph + i * stride, n_document) + suffix
            assert len(ids) == w.target_tokens
            prompts.append(PromptSpec(f"{w.name}-{i}", w.name, w.kind, _decode(tokenizer, ids),
                                      tuple(ids), w.max_tokens, w.target_tokens))
    return prompts


def _user_prompt_specs(tokenizer, user_prompts: Sequence[Mapping[str, Any]],
                       builtin_names: Iterable[str]) -> list[PromptSpec]:
    normalised = _normalise_user_prompts(
        ((i + 1, p) for i, p in enumerate(user_prompts)), "user_prompts")
    clashes = sorted({p["workload"] for p in normalised} & set(builtin_names))
    if clashes:
        raise ValueError(f"user prompt workloads {clashes} clash with built-in workload names")
    specs = []
    for p in normalised:
        _, ids = render_messages(tokenizer, p["messages"])
        specs.append(PromptSpec(p["id"], p["workload"], "user", _decode(tokenizer, ids),
                                tuple(ids), p["max_tokens"], None))
    return specs


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
    prompts += _user_prompt_specs(tokenizer, user_prompts, all_builtin)

    seen: set[str] = set()
    for p in prompts:
        if p.id in seen:
            raise ValueError(f"duplicate prompt id {p.id!r} (user prompt ids must not repeat "
                             f"built-in ids)")
        seen.add(p.id)
    return prompts


# --------------------------------------------------------------------------- user prompt files

# Every prompt goes to every cell and every output is kept (workloads.json, each cell's file): past this a
# run is hours per cell and its files hundreds of MB, so a bigger file is refused before it is even read.
MAX_USER_PROMPTS = 10_000


def _read_jsonl(path: Path) -> list[tuple[int, dict]]:
    """(line number, object) for each non-blank line; PromptFileError on unreadable input. Streamed, and
    stopped at MAX_USER_PROMPTS + 1 objects, so a huge file costs seconds and bounded memory."""
    try:
        handle = Path(path).open(encoding="utf-8")
    except FileNotFoundError:
        raise PromptFileError(path, None, "file not found") from None
    except OSError as e:
        raise PromptFileError(path, None, f"cannot read file: {e.strerror or e}") from None
    rows = []
    with handle:
        try:
            for lineno, line in enumerate(handle, start=1):
                if not line.strip():
                    continue   # blank lines are harmless, e.g. a trailing newline
                if len(rows) == MAX_USER_PROMPTS:
                    raise PromptFileError(path, lineno, f"more than {MAX_USER_PROMPTS:,} prompts: every prompt goes "
                                                        "to every cell and every output is kept; split the file "
                                                        "or keep the prompts that matter")
                rows.append(_parse_line(path, lineno, line))
        except UnicodeDecodeError as e:
            raise PromptFileError(path, None, f"not UTF-8 text ({e.reason})") from None
        except OSError as e:
            raise PromptFileError(path, None, f"cannot read file: {e.strerror or e}") from None
    return rows


def _parse_line(path: Path, lineno: int, line: str) -> tuple[int, dict]:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise PromptFileError(path, lineno, f"invalid JSON: {e.msg} (column {e.colno})") from None
    if not isinstance(obj, dict):
        raise PromptFileError(path, lineno, f"expected a JSON object, got {type(obj).__name__}")
    return lineno, obj


_ABSENT: Any = object()   # a key the user did not give (null is a value, and a wrong one)


class _Invalid(ValueError):
    """What is wrong with one user prompt (the caller names the file and line)."""


@dataclass(frozen=True)
class _Message:
    """One chat message as given: `role` and `content` (other keys of the message are dropped)."""

    role: Any = _ABSENT
    content: Any = _ABSENT

    @classmethod
    def of(cls, message: Mapping[str, Any]) -> "_Message":
        return cls(**{key: message[key] for key in ("role", "content") if key in message})


def _check_messages(messages: Any) -> str | None:
    """None if `messages` is a usable chat, else what is wrong with it."""
    if not isinstance(messages, list) or not messages:
        return "'messages' must be a non-empty list"
    for k, m in enumerate(messages):
        if not isinstance(m, dict):
            return f"messages[{k}] must be an object with 'role' and 'content'"
        message = _Message.of(m)
        if not isinstance(message.role, str) or not message.role.strip():
            return f"messages[{k}] needs a non-empty string 'role'"
        if not isinstance(message.content, str):
            return f"messages[{k}] needs a string 'content'"
    if not any(m["content"].strip() for m in messages):
        return "all messages are empty"
    return None


@dataclass(frozen=True)
class _UserPrompt:
    """One user prompt (a --prompts line, or a dict given to build_workloads), checked on its own by
    `parse`: exactly one of `prompt` or `messages`, and the optional keys of _USER_KEYS with their
    defaults. What depends on the other lines (default ids, duplicates) is _normalise_user_prompts's."""

    prompt: Any = _ABSENT
    messages: Any = _ABSENT
    id: Any = _ABSENT
    name: Any = _ABSENT
    max_tokens: Any = USER_MAX_TOKENS
    workload: Any = USER_WORKLOAD

    @classmethod
    def parse(cls, obj: Any) -> "_UserPrompt":
        """The prompt, or _Invalid saying what is wrong with it."""
        if not isinstance(obj, Mapping):
            raise _Invalid(f"expected a JSON object, got {type(obj).__name__}")
        unknown = sorted(set(obj) - _USER_KEYS)
        if unknown:
            raise _Invalid(f"unknown keys {unknown}; allowed: {sorted(_USER_KEYS)}")
        line = cls(**obj)
        line._check()
        return line

    def _check(self) -> None:
        if (self.prompt is _ABSENT) == (self.messages is _ABSENT):
            raise _Invalid("each line needs exactly one of 'prompt' or 'messages'")
        if self.prompt is not _ABSENT:
            if not isinstance(self.prompt, str) or not self.prompt.strip():
                raise _Invalid("'prompt' must be a non-empty string")
        else:
            problem = _check_messages(self.messages)
            if problem:
                raise _Invalid(problem)
        max_tokens = self.max_tokens
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens <= 0:
            raise _Invalid(f"'max_tokens' must be a positive integer, got {max_tokens!r}")
        workload = self.workload
        if not isinstance(workload, str) or not _WORKLOAD_NAME.match(workload):
            raise _Invalid(f"'workload' must be a name of letters, digits, '_', '.', '-', got {workload!r}")
        given = self.given_ids
        if len(given) == 2 and given[0] != given[1]:
            raise _Invalid("give 'id' or 'name', not two different ones")
        if given and (not isinstance(given[0], str) or not given[0].strip()):
            raise _Invalid(f"'id'/'name' must be a non-empty string, got {given[0]!r}")

    @property
    def given_ids(self) -> list[Any]:
        """`id` and `name` as given (either names the prompt)."""
        return [value for value in (self.id, self.name) if value is not _ABSENT]

    @property
    def chat(self) -> list[dict]:
        """The prompt as chat messages: a plain `prompt` is one user message."""
        if self.prompt is not _ABSENT:
            return [{"role": "user", "content": self.prompt}]
        return [{"role": m.role, "content": m.content} for m in map(_Message.of, self.messages)]


def _normalise_user_prompts(rows: Iterable[tuple[int, Any]], source: str | Path) -> list[dict]:
    """Validate user prompt objects and bring them to one form:
    {"id", "workload", "max_tokens", "messages": [{"role", "content"}, ...]}.

    That form is itself a valid input line, so normalising twice changes nothing. Ids default to
    f"{workload}-{index within workload}", like the built-in ones.
    """
    out: list[dict] = []
    seen_ids: dict[str, int] = {}
    per_workload: dict[str, int] = {}
    for lineno, obj in rows:
        try:
            line = _UserPrompt.parse(obj)
        except _Invalid as problem:
            raise PromptFileError(source, lineno, str(problem)) from None
        index = per_workload.get(line.workload, 0)
        per_workload[line.workload] = index + 1
        given = line.given_ids
        prompt_id = given[0] if given else f"{line.workload}-{index}"
        if prompt_id in seen_ids:
            raise PromptFileError(source, lineno, f"duplicate id {prompt_id!r} (first used at line {seen_ids[prompt_id]})")
        seen_ids[prompt_id] = lineno

        out.append({"id": prompt_id, "workload": line.workload, "max_tokens": line.max_tokens,
                    "messages": line.chat})
    return out


def load_user_prompts(path: str | Path) -> list[dict]:
    """Read a --prompts JSONL file into normalised prompt dicts (see _normalise_user_prompts).

    Each non-blank line is {"prompt": "..."} or {"messages": [{"role", "content"}, ...]}, with
    optional "id" (or "name"), "max_tokens" (default 256) and "workload" (default "user").
    Raises PromptFileError naming the file and line for anything wrong, including an empty file.
    """
    rows = _read_jsonl(Path(path))
    if not rows:
        raise PromptFileError(path, None, "empty file: no prompts")
    return _normalise_user_prompts(rows, path)
