"""Prompt construction: the built-in workload suite and user prompt files.

Everything here is pure and deterministic: given the same tokenizer, max_model_lens, seed, data
directory, counts and user prompts, `build_workloads` returns the same prompts, token for token.
Every cell of the (KV-cache dtype x max_model_len) grid receives exactly these token ids, so the
comparison between cells is not blurred by prompt differences.

One module per job: `records` (PromptSpec), `chat` (encoding and chat rendering), `documents` (corpus
and scoring documents), `suite` (the built-in prompt sets), `round_probes` (later rounds' probes) and
`user_prompts` (--prompts files). Their public names are all importable from here.

Only the stdlib is imported. The tokenizer is duck-typed as a Hugging Face tokenizer:
`tokenizer(text_or_list, add_special_tokens=...)["input_ids"]`, `tokenizer.decode(ids, ...)`,
`tokenizer.apply_chat_template(...)` and the `chat_template` attribute. The run's chat-template
arguments (--chat-template-kwargs) travel with the tokenizer: `with_chat_template_kwargs`.

`PromptSpec.token_ids` is what engines must be given (as a token prompt). `PromptSpec.text` is
`tokenizer.decode(token_ids)` for humans and reports; re-tokenising it is not guaranteed to give
the same ids, because context prompts are cut out of a token stream at exact token counts.
"""
from __future__ import annotations

from kveval.inputs.resources import DATA_DIR
from kveval.inputs.workloads.chat import (ChatTemplateTokenizer, decode, encode, render_chat, render_messages,
                                          with_chat_template_kwargs)
from kveval.inputs.workloads.documents import document_tokens, load_corpus
from kveval.inputs.workloads.records import PromptFileError, PromptSpec
from kveval.inputs.workloads.round_probes import ROUND_PROBES_FILE, round_probe_pool_size, round_probe_prompts
from kveval.inputs.workloads.suite import (CONTEXT_QUESTIONS, CTX_1K_TOKENS, CTX_MAX_TOKENS, DEFAULT_CONTEXT_FRACTIONS,
                                           DEFAULT_COUNTS, MIN_DOCUMENT_TOKENS, MIN_MAX_MODEL_LEN,
                                           OVER_LIMIT_MAX_TOKENS, OVER_LIMIT_QUESTION, PROBE_MAX_TOKENS,
                                           PROBE_WORKLOAD, SHORT_WORKLOADS, build_workloads, load_questions)
from kveval.inputs.workloads.user_prompts import MAX_USER_PROMPTS, USER_MAX_TOKENS, USER_WORKLOAD, load_user_prompts

__all__ = [
    "CONTEXT_QUESTIONS", "CTX_1K_TOKENS", "CTX_MAX_TOKENS", "DATA_DIR", "DEFAULT_CONTEXT_FRACTIONS", "DEFAULT_COUNTS",
    "MAX_USER_PROMPTS", "MIN_DOCUMENT_TOKENS", "MIN_MAX_MODEL_LEN", "OVER_LIMIT_MAX_TOKENS", "OVER_LIMIT_QUESTION",
    "PROBE_MAX_TOKENS", "PROBE_WORKLOAD", "ROUND_PROBES_FILE", "SHORT_WORKLOADS", "USER_MAX_TOKENS", "USER_WORKLOAD",
    "ChatTemplateTokenizer", "PromptFileError", "PromptSpec", "build_workloads", "decode", "document_tokens", "encode",
    "load_corpus", "load_questions", "load_user_prompts", "render_chat", "render_messages", "round_probe_pool_size",
    "round_probe_prompts", "with_chat_template_kwargs",
]
