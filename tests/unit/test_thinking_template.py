"""Issue 38: a thinking chat template (Qwen3 / Qwen3.5 style) spends a task's short answers inside <think>.
kveval reads the template's switch before any engine (inputs/thinking_template), says so then, and the
review says in one line, naming the flag, when most task answers came back empty or inside <think>."""
from __future__ import annotations

import pytest

from kveval.analysis.thinking import count_thinking, spent_thinking, thinking_line
from kveval.inputs.model_config import prompt_format
from kveval.inputs.thinking_template import opens_thinking, thinking_facts
from kveval.inputs.workloads import with_chat_template_kwargs
from kveval.render.run_section import run_section
from tests.support.evidence import typed_evidence, typed_manifest
from tests.unit.test_chat_template_kwargs import thinking_tokenizer  # noqa: F401 - the fixture

# Qwen3.5's rule: the generation prompt opens <think> unless enable_thinking is false (then an empty block).
OPENING_TEMPLATE = (
    "{%- for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}"
    "{%- if add_generation_prompt %}<|assistant|>\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n"
    "{% else %}<think>\n{% endif %}{%- endif %}")


def test_the_switch_is_read_from_the_template_and_the_prompt_checked_with_the_runs_arguments(thinking_tokenizer):
    facts = thinking_facts(thinking_tokenizer)
    assert facts == {"thinking_switch": "enable_thinking", "opens_thinking": False}
    thinking_tokenizer.chat_template = OPENING_TEMPLATE
    try:
        assert thinking_facts(thinking_tokenizer)["opens_thinking"] is True
        off = with_chat_template_kwargs(thinking_tokenizer, {"enable_thinking": False})
        assert thinking_facts(off) == {"thinking_switch": "enable_thinking", "opens_thinking": False}
        assert prompt_format(thinking_tokenizer)["thinking_switch"] == "enable_thinking"
    finally:
        from tests.unit.test_chat_template_kwargs import THINKING_TEMPLATE
        thinking_tokenizer.chat_template = THINKING_TEMPLATE


def test_a_template_without_a_switch_adds_nothing_to_the_manifest():
    from tests.support.char_tokenizer import CharTokenizer

    assert set(prompt_format(CharTokenizer())) == {"chat_template", "bos_token", "adds_bos"}


@pytest.mark.parametrize("response, opened, spent", [
    ("", False, True), ("   ", False, True),
    ("<think>The user asks for the capital", False, True),         # cut off inside the model's own block
    ("<think>ok</think>\n\n", False, True),                         # nothing after the block
    ("<think>ok</think>\n\nParis", False, False),
    ("Paris", False, False),
    ("The user asks for the capital of", True, True),               # the prompt opened <think>; never closed
    ("hmm</think>\n\nParis", True, False),
])
def test_an_answer_spent_thinking(response, opened, spent):
    assert spent_thinking(response, opened) is spent


def test_the_prompt_opens_thinking_only_when_its_last_block_is_open():
    assert opens_thinking("<|assistant|>\n<think>\n") and not opens_thinking("<think>\n\n</think>\n\n")
    assert not opens_thinking("<|assistant|>\n")


def _review(responses, switch="enable_thinking", kwargs=None, opened=False):
    manifest = typed_manifest({"prompt_format": {"chat_template": True, "bos_token": None, "adds_bos": False,
                                                 "thinking_switch": switch, "opens_thinking": opened},
                               "options": {"chat_template_kwargs": kwargs, "kv": ["fp8", "auto"],
                                           "max_model_len": [2048]},
                               "command": "kveval compare", "model": {"path": "m", "source": "s"}})
    rows = [{"cell": "fp8-2048", "task": "needle", "accepted": True, "response": text, "status": "scored",
             "scored": True, "scored_correct": False} for text in responses]
    evidence = typed_evidence({"tasks": {"baseline_kv": "auto", "tasks": ["needle"], "samples": len(rows),
                                         "sample_rows": rows}})
    return [line for line in run_section(manifest, evidence).splitlines() if "Thinking template" in line]


def test_the_review_names_the_flag_when_most_answers_were_spent_thinking():
    lines = _review(["<think>Let me", "", "<think>So", "Paris"])
    assert lines == ["- **Thinking template:** 3 of 4 task answers came back empty or inside <think>, so task "
                     "accuracy measures thinking, not answers, on every cell alike; turn it off with "
                     "--chat-template-kwargs '{\"enable_thinking\": false}'"]
    assert _review(["Paris", "Rome", "<think>x", "Bern"]) == []          # a few: nothing said
    assert "no switch" in _review(["", ""], switch=None)[0]
    given = _review(["", ""], kwargs={"enable_thinking": True})[0]
    assert "check that its value turns thinking off" in given and "turn it off with" not in given


def test_the_count_reads_every_answer_once():
    counted = count_thinking(["", "a", "<think>b"], prompt_opens_thinking=False)
    assert (counted.spent, counted.answers, counted.most) == (2, 3, True)
    assert thinking_line(count_thinking([], False), "enable_thinking", False) is None
