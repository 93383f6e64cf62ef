"""A chat template's thinking switch (issue 38), read before any engine starts: Qwen3 / Qwen3.5-style templates
take a variable (enable_thinking) that turns thinking off; left on, a task's 16-64 answer tokens go inside <think>."""
from __future__ import annotations

from typing import Iterable, Optional

# The template variables that turn thinking off: Qwen3/3.5 and most others use enable_thinking; DeepSeek-V3.1
# and some GLM templates use thinking.
THINKING_SWITCHES = ("enable_thinking", "thinking")
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


def thinking_switch(template_variables: Iterable[str]) -> Optional[str]:
    """The chat template's thinking switch among its variables, or None."""
    names = set(template_variables)
    return next((name for name in THINKING_SWITCHES if name in names), None)


def opens_thinking(generation_prompt: str) -> bool:
    """The rendered generation prompt leaves a <think> block open: the model answers inside it."""
    return generation_prompt.rfind(THINK_OPEN) > generation_prompt.rfind(THINK_CLOSE)


def thinking_facts(tokenizer) -> dict:
    """A thinking template's switch and whether the generation prompt (with the run's template arguments)
    leaves <think> open; {} for any other tokenizer, so their manifests stay as they were."""
    template = getattr(tokenizer, "chat_template", None)
    if not isinstance(template, str):
        return {}
    try:
        import jinja2
        from jinja2 import meta

        switch = thinking_switch(meta.find_undeclared_variables(jinja2.Environment().parse(template)))
    except Exception:  # noqa: BLE001 - a template jinja2 cannot parse here: vLLM will say so when rendering
        return {}
    if switch is None:
        return {}
    try:
        rendered = tokenizer.apply_chat_template([{"role": "user", "content": "x"}], tokenize=False,
                                                 add_generation_prompt=True)
    except Exception:  # noqa: BLE001 - the prompts' own rendering reports a broken template
        return {"thinking_switch": switch}
    return {"thinking_switch": switch, "opens_thinking": opens_thinking(str(rendered))}
