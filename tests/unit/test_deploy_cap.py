"""The deploy line's --max-model-len (issue 41): capped at the longest length up to which every tested length
passed, so the pasted line never serves a length that failed or was not decided."""
from __future__ import annotations

import pytest

from kveval.gate import FAIL, INCONCLUSIVE, NOT_STARTED, PASS
from kveval.render.headline import longest_passing


@pytest.mark.parametrize("statuses,cap", [
    ({PASS: [2048, 8192, 32768]}, 32768),
    ({PASS: [2048], FAIL: [8192]}, 2048),
    ({PASS: [2048, 32768], FAIL: [8192]}, 2048),            # a pass above a failure is not safe to serve
    ({PASS: [8192], INCONCLUSIVE: [2048]}, None),           # the shortest length is undecided: nothing to cap at
    ({PASS: [2048, 8192], NOT_STARTED: [32768]}, 8192),
])
def test_the_cap_is_the_top_of_the_passing_prefix(statuses, cap):
    assert longest_passing(statuses) == cap
