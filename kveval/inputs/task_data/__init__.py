"""Long-context task data: RULER-style synthetic documents for lm-eval (see lm_eval_tasks/).

Six tasks (passkey, three needle-in-a-haystack variants, variable tracking, common-word
extraction) are generated here as JSONL docs, one file per task, in the schema that
lm_eval_tasks/utils.py loads. Everything is pure and deterministic: the same tokenizer, arguments and
data directory give byte-identical docs, so every cell of a (KV-cache dtype x max_model_len)
grid is asked exactly the same questions.

Each doc is sized as a share of max_model_len, measured the way the engine will see it: the
whole user turn rendered with the chat template (`kveval.inputs.workloads.render_chat`). The final size
is at most the target and at most SIZE_TOLERANCE tokens under it; a share above 1 is allowed so
that rejection of too-long prompts can be probed.

One registry entry per task (`registry.TASKS`: generator, haystack, lm-eval YAML, scoring); the
generators in `needle_tasks` and `cwe` over the shared haystack machinery (`haystack`); docs and files
from the registry in `generate`. Their public names are all importable from here.

Only the stdlib is imported; the tokenizer is duck-typed as in kveval.inputs.workloads.
"""
from __future__ import annotations

from kveval.inputs.task_data.cwe import CWE_COMMON, CWE_INTRO, CWE_QUESTION
from kveval.inputs.task_data.generate import DEFAULT_DEPTHS, DEFAULT_FRACTIONS, generate_task_docs, write_task_data
from kveval.inputs.task_data.haystack import MIN_HAYSTACK_TOKENS, SIZE_TOLERANCE
from kveval.inputs.task_data.needle_tasks import (NIAH_INTRO, NIAH_MULTIVALUE_QUESTION, NIAH_NEEDLE, NIAH_QUESTION,
                                                 PASSKEY_FILLER, PASSKEY_INTRO, PASSKEY_NEEDLE, PASSKEY_QUESTION,
                                                 VT_INTRO, VT_QUESTION)
from kveval.inputs.task_data.registry import METRICS, SCORING, TASK_GROUP, TASKS, TaskSpec, resolve_task_names

__all__ = [
    "CWE_COMMON", "CWE_INTRO", "CWE_QUESTION", "DEFAULT_DEPTHS", "DEFAULT_FRACTIONS", "METRICS", "MIN_HAYSTACK_TOKENS",
    "NIAH_INTRO", "NIAH_MULTIVALUE_QUESTION", "NIAH_NEEDLE", "NIAH_QUESTION", "PASSKEY_FILLER", "PASSKEY_INTRO",
    "PASSKEY_NEEDLE", "PASSKEY_QUESTION", "SCORING", "SIZE_TOLERANCE", "TASKS", "TASK_GROUP", "TaskSpec", "VT_INTRO",
    "VT_QUESTION", "generate_task_docs", "resolve_task_names", "write_task_data",
]
