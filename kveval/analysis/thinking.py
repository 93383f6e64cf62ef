"""Answers spent thinking (issue 38): a thinking chat template left on spends a task's 16-64 answer tokens inside
<think>, so both caches score ~0 % and the task comparison says nothing about FP8. Pure: the task responses and
the template's facts (inputs/thinking_template.py) in, one count and one review line out."""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Optional

from kveval.inputs.thinking_template import THINK_CLOSE, THINK_OPEN

MOST = 0.5   # the share of answers that must look like thinking before the review says so


def spent_thinking(response: Optional[str], prompt_opens_thinking: bool) -> bool:
    """An answer that is empty, that ends inside a think block (opened by the prompt or by the model), or that
    is nothing but a closed think block."""
    text = (response or "").strip()
    if not text:
        return True
    last_open, last_close = text.rfind(THINK_OPEN), text.rfind(THINK_CLOSE)
    if last_open > last_close or (prompt_opens_thinking and last_close < 0):
        return True
    if last_close < 0:
        return False
    after = text[last_close + len(THINK_CLOSE):]
    return not re.sub(r"<think>.*?</think>", "", after, flags=re.S).strip()


@dataclass(frozen=True)
class ThinkingAnswers:
    spent: int         # answers empty or still inside <think>
    answers: int       # answers looked at

    @property
    def most(self) -> bool:
        return self.answers > 0 and self.spent / self.answers >= MOST


def count_thinking(responses: Iterable[Optional[str]], prompt_opens_thinking: bool) -> ThinkingAnswers:
    responses = list(responses)
    return ThinkingAnswers(sum(spent_thinking(r, prompt_opens_thinking) for r in responses), len(responses))


def thinking_line(counted: ThinkingAnswers, switch: Optional[str], switch_given: bool) -> Optional[str]:
    """One review line when most task answers came back empty or inside <think>; None otherwise."""
    if not counted.most:
        return None
    head = (f"- **Thinking template:** {counted.spent} of {counted.answers} task answers came back empty or "
            "inside <think>, so task accuracy measures thinking, not answers, on every cell alike")
    if switch and not switch_given:
        return head + f"; turn it off with --chat-template-kwargs '{{\"{switch}\": false}}'"
    if switch:
        return head + f" (--chat-template-kwargs set {switch}: check that its value turns thinking off)"
    return head + "; this chat template has no switch to turn thinking off"
