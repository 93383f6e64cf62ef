"""Named presets: how many prompts, how long the answers, how many speed runs.

`standard` is shaped like the published field study (3+2 short chats with 256/512 new tokens,
~1K-token contexts, 25 %/90 % contexts, an over-limit prompt per cell; 1 warm-up + 3 speed runs).
`quick` keeps every workload kind but one prompt each and shorter answers, so the whole demo runs
in minutes on a 2-core CPU. Presets only set defaults; explicit options win.
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

from kveval.inputs.workloads import PromptSpec


@dataclass(frozen=True)
class Suite:
    name: str
    counts: dict[str, int] | None = None          # None: the workloads module's defaults
    max_tokens_scale: float = 1.0                 # shorter answers for every built-in prompt
    speed_runs: int = 3
    speed_warmup: int = 1
    speed_workloads: tuple[str, ...] | None = None  # None: every workload except over-limit ones
    speed_max_tokens: int | None = None
    # Teacher-forced documents per max_model_len, their sizes spread evenly from the first share of it to the
    # second: every one reaches the late half, and the divergence intervals count documents, not positions
    # (analysis/cluster_interval.py), so more, shorter documents pin a KL down better than one long one.
    scoring_documents: int = 12
    scoring_doc_fractions: tuple[float, float] = (0.55, 0.9)
    scoring_top_k: int = 20
    # Long-context tasks: prompt sizes as shares of each max_model_len, needle depths, and samples
    # per (task, size, depth) point.
    task_fractions: tuple[float, ...] = (0.25, 0.5, 0.9)
    task_depths: tuple[float, ...] = (0.1, 0.5, 0.9)
    task_samples: int = 1
    # On a GPU the first look takes this many samples per point instead: there task samples cost seconds
    # and every further round costs engine starts (run/rounds.py), so a large first look decides sooner.
    task_samples_gpu: int | None = 5
    # Throughput under concurrency: request counts submitted at once (plus each cell's own maximum),
    # the prompt as a share of max_model_len, and the tokens each request decodes.
    throughput_levels: tuple[int, ...] = (1, 4, 16, 64)
    throughput_prompt_share: float = 0.5
    throughput_max_tokens: int = 64
    # Repeats of each throughput level and speed workload (issue 41, worker/repeats.py): at least
    # `throughput_repeats` per level (`speed_runs` per workload), then more until the median's 95 % interval
    # is within `repeat_target` of it, at most `repeat_max`, while the phase's repeat time per cell lasts.
    throughput_repeats: int = 3
    repeat_max: int = 20
    repeat_target: float = 0.05
    speed_repeat_budget_s: float = 60.0
    throughput_repeat_budget_s: float = 180.0
    # The engine-efficiency reference (worker/efficiency.py): the run's first cell replays up to this
    # many of each phase's accepted requests as one batched call after the phase. All of them in every
    # built-in workload, so the reference batch is the phase's own: a smaller one runs slower per token
    # and would flatter the phase.
    efficiency_sample: int = 512
    description: str = ""


SUITES: dict[str, Suite] = {
    "standard": Suite("standard", description="field-study shape: 3+2 short chats (256/512 new tokens), "
                      "2 x ~1K-token contexts, 25 %/90 % contexts, over-limit prompts; 1 warm-up + 3 speed runs; "
                      "6 long-context tasks at 25/50/90 % of max_model_len x depths 10/50/90 %, 1 sample each"),
    "full": Suite("full", task_samples=5, scoring_documents=24,
                  description="standard, with 5 samples per task x size x depth point (270 task samples per cell): "
                              "for GPU runs, where McNemar's test needs the numbers"),
    "quick": Suite(
        "quick", counts={"short_256": 1, "short_512": 1, "ctx_1k": 1, "ctx_pct": 1, "over": 1},
        max_tokens_scale=0.25, speed_runs=2, speed_warmup=1, speed_workloads=("short", "ctx_1k"), speed_max_tokens=32,
        scoring_documents=8, scoring_doc_fractions=(0.55, 0.65), task_fractions=(0.25, 0.5), task_depths=(0.5,), task_samples=1,
        throughput_levels=(1, 4), throughput_prompt_share=0.125, throughput_max_tokens=16,
        speed_repeat_budget_s=30.0, throughput_repeat_budget_s=60.0,
        description="one prompt per workload, answers a quarter as long (64/128 tokens), 1 warm-up + 2 speed runs on the "
                    "short and ~1K prompts (32 tokens), 6 long-context tasks at 25/50 % of max_model_len, depth 50 %: "
                    "minutes on a 2-core CPU",
    ),
}

_SHORT = re.compile(r"^short_\d+$")

# Issue 39: long lengths on a small card. A task sample costs its prompt's prefill, a share of max_model_len,
# so the GPU's 5 samples per point cost 14.6M tokens per cell at 98,304 (6 tasks x 3 sizes x 3 depths x 0.55 of
# the length, 270 prompts): hours per cell on a consumer card, a day for a run. The first look's task prompts
# are therefore held to this many prefilled tokens per cell: 5 samples per point up to 32,768 (4.9M tokens),
# 2 at 65,536, 1 at 98,304 (2.9M); rounds (--budget) add samples only where the first look did not decide.
FIRST_LOOK_TASK_TOKENS = 5_000_000


def sized_task_samples(samples: int, points: int, fractions: tuple[float, ...], longest: int) -> tuple[int, str | None]:
    """Samples per task point for the first look on a GPU, at most `samples`, so that the longest cell's task
    prompts stay within FIRST_LOOK_TASK_TOKENS; and a line saying so when it lowered them."""
    per_sample = points * longest * (sum(fractions) / len(fractions)) if fractions and points else 0
    if per_sample <= 0:
        return samples, None
    fitting = max(1, int(FIRST_LOOK_TASK_TOKENS // per_sample))
    if fitting >= samples:
        return samples, None
    return fitting, (f"Task samples per point: {fitting} (not {samples}) at max_model_len {longest:,}: the first look's "
                     f"task prompts are held to ~{FIRST_LOOK_TASK_TOKENS / 1e6:.0f}M prefilled tokens per cell "
                     f"({points * fitting} prompts, ~{per_sample * fitting / 1e6:.1f}M tokens), so a long run on a "
                     "small card takes hours, not a day; rounds add samples where it does not decide "
                     "(--task-samples sets them)")


def get_suite(name: str) -> Suite:
    try:
        return SUITES[name]
    except KeyError:
        raise ValueError(f"unknown suite {name!r}; choose one of: {', '.join(SUITES)}") from None


def scale_max_tokens(prompts: list[PromptSpec], scale: float) -> list[PromptSpec]:
    """Shorten built-in answers; a short_N workload is renamed after its new length so names stay true."""
    if scale == 1.0:
        return prompts
    scaled = []
    for prompt in prompts:
        if prompt.kind == "user":
            scaled.append(prompt)
            continue
        max_tokens = max(1, round(prompt.max_tokens * scale))
        workload = f"short_{max_tokens}" if _SHORT.match(prompt.workload) else prompt.workload
        index = prompt.id.rsplit("-", 1)[-1]
        scaled.append(dataclasses.replace(prompt, max_tokens=max_tokens, workload=workload, id=f"{workload}-{index}"))
    return scaled


def speed_workloads(prompts: list[PromptSpec], selectors: tuple[str, ...] | None) -> list[str] | None:
    """Expand selectors ("short" = every short_N workload, or exact names) to workload names."""
    if selectors is None:
        return None
    names = []
    for prompt in prompts:
        if prompt.workload in names:
            continue
        if prompt.workload in selectors or (prompt.kind in selectors):
            names.append(prompt.workload)
    return names
