"""Later rounds' degeneration probes (run/rounds.py): new questions from their own pool, never repeated."""
from __future__ import annotations

import random
from pathlib import Path

from kveval.inputs.resources import DATA_DIR
from kveval.inputs.workloads.chat import decode, render_chat
from kveval.inputs.workloads.records import PromptSpec
from kveval.inputs.workloads.suite import PROBE_MAX_TOKENS, PROBE_WORKLOAD, load_questions

# Later rounds of degeneration evidence (run/rounds.py) draw new probes from here, never from probes.jsonl,
# so the first look stays what it was and no round repeats a question.
ROUND_PROBES_FILE = "probes_rounds.jsonl"


def round_probe_pool_size(data_dir: Path = DATA_DIR) -> int:
    """How many questions later rounds can draw from, all rounds together."""
    return len(load_questions(data_dir, ROUND_PROBES_FILE))


def round_probe_prompts(tokenizer, round_number: int, start: int, count: int, *, seed: int = 0,
                        data_dir: Path = DATA_DIR) -> list[PromptSpec]:
    """Round `round_number`'s probes: questions start .. start+count of a seeded shuffle of
    data/probes_rounds.jsonl (each round starts where the one before stopped), ids probe-r<k>-<i>,
    rendered and capped like the first look's probes. Fewer when the pool runs out."""
    questions = load_questions(data_dir, ROUND_PROBES_FILE)
    random.Random(f"{seed}:round-probes").shuffle(questions)
    prompts = []
    for i, question in enumerate(questions[start:start + count]):
        _, ids = render_chat(tokenizer, question)
        prompts.append(PromptSpec(f"{PROBE_WORKLOAD}-r{round_number}-{i}", PROBE_WORKLOAD, "probe",
                                  decode(tokenizer, ids), tuple(ids), PROBE_MAX_TOKENS, None))
    return prompts

