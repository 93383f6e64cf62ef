"""Constructed long-context task records (the tasks phase's per-sample format), no engine or lm-eval."""
from __future__ import annotations

import copy


def sample(task: str, index: int, *, length: int = 1024, fraction: float | None = 0.25, depth: float | None = 0.5,
           correct: bool | None = True, accepted: bool = True, error: str | None = None,
           expected: tuple[str, ...] = ("71432",), response: str | None = None, seed: int = 0) -> dict:
    """One stored sample. accepted False -> rejected (score/correct None); error -> accepted but not scored."""
    depth_tag = "" if depth is None else f"-d{depth:.2f}"
    target = None if fraction is None else round(fraction * length)
    scored = accepted and error is None
    if response is None:
        response = (" ".join(expected) if correct else "I do not know") if scored else None
    return {
        "task": task, "doc_id": index,
        "sample_id": f"{task}-L{length}-f{fraction}{depth_tag}-s{seed}-{index}",
        "length_fraction": fraction, "depth": depth, "target_tokens": target,
        "prompt_tokens": None if target is None else target - 3, "max_gen_toks": 16,
        "accepted": accepted,
        "rejection": None if accepted else f"prompt of {target} tokens + 16 > max_model_len {length}",
        "error": error, "response": response, "expected": list(expected),
        "score": (1.0 if correct else 0.0) if scored else None,
        "correct": bool(correct) if scored else None,
        "partial": (1.0 if correct else 0.0) if scored else None,
        "finish_reason": "stop" if scored else None, "output_tokens": 5 if scored else None, "seconds": 0.5,
    }


def tasks_phase(samples: list[dict], tasks: list[str] | None = None) -> dict:
    return {"tasks": tasks or list(dict.fromkeys(s["task"] for s in samples)), "lm_eval_version": "0.4.13",
            "data_dir": "taskdata", "limit": None, "lm_eval_results": {}, "task_errors": {}, "samples": samples}


def with_tasks(facts: dict, samples: list[dict] | None = None, error: str | None = None) -> dict:
    """A copy of a cell's facts carrying a tasks phase (or a crashed one when `error` is given)."""
    facts = copy.deepcopy(facts)
    facts.setdefault("phases", {})["tasks"] = ({"error": error, "seconds": 1.0} if error is not None
                                               else tasks_phase(samples or []))
    return facts


def passkey_grid(length: int = 1024, wrong: set[tuple[float, float, int]] = frozenset(),
                 fractions=(0.25, 0.5, 1.0), depths=(0.0, 0.5, 1.0), seeds: int = 2) -> list[dict]:
    """kveval_passkey over fractions × depths × seeds; fraction 1.0 is rejected (no room for the answer);
    (fraction, depth, seed) in `wrong` are answered wrongly."""
    out, index = [], 0
    for fraction in fractions:
        for depth in depths:
            for seed in range(seeds):
                out.append(sample("kveval_passkey", index, length=length, fraction=fraction, depth=depth, seed=seed,
                                  accepted=fraction < 1.0, correct=(fraction, depth, seed) not in wrong))
                index += 1
    return out
