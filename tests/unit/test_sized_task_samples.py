"""Issue 39: the GPU's first-look task samples are sized to the longest length, so a 96K run on a small card
takes hours, not a day (inputs/suites.sized_task_samples)."""
from __future__ import annotations

from kveval.inputs.suites import FIRST_LOOK_TASK_TOKENS, SUITES, sized_task_samples

STANDARD = SUITES["standard"]
POINTS = 6 * len(STANDARD.task_fractions) * len(STANDARD.task_depths)   # kveval's six tasks x sizes x depths


def test_lengths_up_to_32k_keep_the_gpus_five_samples_per_point():
    for length in (2048, 8192, 32768):
        assert sized_task_samples(5, POINTS, STANDARD.task_fractions, length) == (5, None)


def test_longer_lengths_are_held_to_the_token_budget_and_say_so():
    samples, note = sized_task_samples(5, POINTS, STANDARD.task_fractions, 98304)
    assert samples == 1
    assert "1 (not 5)" in note and "98,304" in note and "54 prompts" in note
    samples, _ = sized_task_samples(5, POINTS, STANDARD.task_fractions, 65536)
    assert samples == 2
    # What is kept fits the budget (at least one sample per point, whatever the length).
    mean_share = sum(STANDARD.task_fractions) / len(STANDARD.task_fractions)
    assert POINTS * samples * 65536 * mean_share <= FIRST_LOOK_TASK_TOKENS
    assert sized_task_samples(5, POINTS, STANDARD.task_fractions, 1_000_000)[0] == 1


def test_nothing_to_size_without_task_points():
    assert sized_task_samples(5, 0, STANDARD.task_fractions, 98304) == (5, None)
