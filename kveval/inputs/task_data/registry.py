"""The registry of kveval's long-context tasks: one entry per task holds all of it, as lm-eval's task
config does. Its data generator and haystack (`generate`, `sources`), its answer budget, its lm-eval YAML
(lm_eval_tasks/<name>.yaml, which must agree: tests/unit/test_task_files.py) and how it is scored
(`scoring`: the YAML's process_results hook and the metrics it reports)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

from kveval.inputs.resources import LM_EVAL_TASKS_DIR
from kveval.inputs.task_data.cwe import cwe, cwe_sources
from kveval.inputs.task_data.needle_tasks import (essay_sources, niah_multikey, niah_multivalue, niah_single, passkey,
                                                 passkey_sources, vt)

TASK_GROUP = "kveval_longctx"
# How every kveval task is scored: lm_eval_tasks/utils.py's process_results (the YAMLs' hook), which
# reports both metrics per doc; the group averages them weighted by size.
SCORING = "utils.process_results"
METRICS = ("all_match", "partial_match")

# (tokenizer, its sources' haystack, rng, target tokens, depth) -> (text, prompt tokens, needle depths, expected outputs)
Generator = Callable[..., tuple]


@dataclass(frozen=True)
class TaskSpec:
    name: str            # lm-eval task name (also the YAML `task:` and the JSONL file stem)
    short: str           # what the CLI also accepts
    description: str
    max_gen_toks: int    # answer budget; the YAML's generation_kwargs.max_gen_toks must match
    uses_depth: bool     # False: docs have depth null and no needles (cwe)
    generate: Generator                       # one doc's text, size, needle depths and expected outputs
    sources: Callable[..., Any]               # (tokenizer, data_dir) -> what `generate` draws from, tokenised once per call
    scoring: str = SCORING                    # the YAML's process_results hook
    metrics: tuple[str, ...] = METRICS        # what it reports, as the YAML's metric_list names them

    @property
    def yaml(self) -> Path:
        """The task's lm-eval config (lm_eval_tasks/, usable with the plain lm_eval CLI)."""
        return LM_EVAL_TASKS_DIR / f"{self.name}.yaml"

    @property
    def docs_hook(self) -> str:
        """The YAML's custom_dataset hook: reads <data_dir>/<name>.jsonl, written by write_task_data."""
        return f"utils.{self.name}_docs"


TASKS: dict[str, TaskSpec] = {spec.name: spec for spec in (
    TaskSpec("kveval_passkey", "passkey",
             "a 5-digit pass key hidden in repeated filler sentences", 16, True,
             passkey, passkey_sources),
    TaskSpec("kveval_niah_single", "niah_single",
             "one 7-digit magic number for a key, hidden in essay text", 32, True,
             niah_single, essay_sources),
    TaskSpec("kveval_niah_multikey", "niah_multikey",
             "four magic numbers under different keys; the one for the asked key", 32, True,
             niah_multikey, essay_sources),
    TaskSpec("kveval_niah_multivalue", "niah_multivalue",
             "four magic numbers under one key; all four must be recalled", 64, True,
             niah_multivalue, essay_sources),
    TaskSpec("kveval_vt", "vt",
             "a 4-hop chain of variable assignments; every variable holding the value", 64, True,
             vt, essay_sources),
    TaskSpec("kveval_cwe", "cwe",
             "the 5 most common words of a long numbered word list", 64, False,
             cwe, cwe_sources),
)}
_BY_SHORT = {spec.short: name for name, spec in TASKS.items()}


def resolve_task_names(names: str | Iterable[str]) -> list[str]:
    """Full task names, in the order given, without repeats.

    Accepts a comma-separated string or a list; short names map to full ones, "kveval_longctx"
    and "all" to the six. Other names are kept as they are: they may be lm-eval built-ins.
    """
    if isinstance(names, str):
        names = names.split(",")
    out: list[str] = []
    for name in (part.strip() for raw in names for part in str(raw).split(",")):
        if not name:
            continue
        if name in (TASK_GROUP, "all"):
            expanded = list(TASKS)
        else:
            expanded = [_BY_SHORT.get(name, name)]
        out.extend(n for n in expanded if n not in out)
    return out
