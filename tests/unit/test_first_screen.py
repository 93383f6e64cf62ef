"""Issue 41: a review's first screen is short and answers the operator's question on its own: the verdict, the
deployable configuration, the headline (pool gain and why), the decision table and the deploy line with its
cost, before any reason or section. Checked on every published review (re-rendered by the golden test)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

REPORTS = Path(__file__).resolve().parents[2] / "reports"
REVIEWS = sorted(p for p in REPORTS.rglob("review.md") if "archive" not in p.parts)
# What follows the first screen: the reasons (render/verdict_section.py).
_AFTER = re.compile(r"^(Why:|Every required check passed:|Also noted:|## )")


def first_screen(review: str) -> list[str]:
    """The review's non-blank lines from its title up to the first reason or the next section."""
    lines = review.splitlines()
    screen = [lines[0]]
    for line in lines[1:]:
        if _AFTER.match(line) and not line.startswith("## Verdict"):
            break
        if line.strip():
            screen.append(line)
    return screen


@pytest.mark.parametrize("review", REVIEWS, ids=[str(p.parent.relative_to(REPORTS)) for p in REVIEWS])
def test_the_first_screen_is_at_most_15_lines_and_answers_alone(review):
    screen = first_screen(review.read_text(encoding="utf-8"))
    assert len(screen) <= 15, "\n".join(screen)
    assert screen[1].startswith("## Verdict: **")
    assert screen[2].startswith("Deployable FP8 configuration: **")
    assert screen[3].startswith("**") and screen[3].endswith("**")           # the headline sentence
    deploy = [line for line in screen if line.startswith("Deploy") and not line.startswith("Deployable")]
    assert len(deploy) == 1 and "`vllm serve MODEL --kv-cache-dtype" in deploy[0]
    if "passes at" in deploy[0] and "fp8" in deploy[0].split("`vllm serve")[1]:
        # A deployable FP8 configuration: its --max-model-len cap, and its cost against auto where speed was measured.
        assert "--max-model-len" in deploy[0]
        text = review.read_text(encoding="utf-8")
        if "\n## Throughput under concurrency" in text and (review.parent / "manifest.json").exists():
            assert any(line.startswith("Cost against `auto`") for line in screen)
