"""results.json: the deployment answer, the decision and the document itself (`Results`)."""
from __future__ import annotations

from typing import Literal, Optional

from kveval.files.schema.base import FileModel, Number
from kveval.files.schema.evidence import Evidence
from kveval.files.schema.verdict import Status, VerdictRecord


class CostRatio(FileModel):
    """analysis/deploy_cost: one figure of the deployed configuration against `auto` at one point."""

    figure: Literal["output_tok_s", "ttft"]
    where: str                      # "concurrency 256" or the speed workload ("ctx_pct, 7,000 tokens")
    concurrency: Optional[int] = None
    prompt_tokens: Optional[int] = None   # TTFT: the workload's prompt
    ratio: Number                   # configuration / auto (Hodges-Lehmann over the repeats)
    low: Optional[Number] = None    # its interval (None: one run each side)
    high: Optional[Number] = None
    confidence: Optional[Number] = None   # the interval's real coverage


class DeploymentCost(FileModel):
    """The deployed configuration's throughput and TTFT against `auto` at the deployed max_model_len."""

    max_model_len: int
    throughput: list[CostRatio]     # output tok/s × auto per concurrency level measured
    ttft: list[CostRatio]           # TTFT × auto per speed workload (concurrency 1)
    line: str                       # the review's cost line, word for word


class Goodput(FileModel):
    """analysis/deploy_choice: a passing configuration's goodput under --slo at the deployed length."""

    configuration: str
    concurrency: Optional[int]      # the highest level measured that meets every objective (None: none does)
    requests_per_s: Optional[Number]


class Deployment(FileModel):
    """render/headline.deployment: the configuration to deploy, as the review's first screen states it (issue 41)."""

    line: str                                     # the review's deploy line, word for word
    configuration: Optional[str]                  # the passing KV spec (fp8, fp8:keep=0,1); None: keep the model dtype's
    vllm_serve: str                               # the command to paste (MODEL: the model as the user serves it)
    max_model_len: Optional[int]                  # the cap: every tested length up to it passed
    passes_at: list[int]
    pool_ratio: Optional[Number]                  # its KV pool against `auto` at the lengths that passed
    vllm_version: Optional[str]                   # the vLLM it was verified on
    attention_backend: Optional[str]              # the backend its cells were moved to, when not the default
    enforce_eager: bool
    # Issue 41, absent before: what the configuration costs against `auto` (analysis/deploy_cost.py), how it
    # was chosen, and the requests vLLM runs at once with it.
    cost: Optional[DeploymentCost] = None
    preference: Optional[str] = None              # capacity | throughput | latency
    slo: Optional[list[str]] = None               # the --slo targets it was chosen by
    goodput: Optional[list[Goodput]] = None       # per passing configuration, with an SLO
    max_num_seqs: Optional[int] = None            # the engine's cap on requests at once
    concurrent_requests: Optional[Number] = None  # requests of max_model_len at once: min(pool's, max_num_seqs)
    notes: list[str] = []                         # one line each: the SLO's outcome, what --search would add


class Decision(FileModel):
    """gate/decision.decide: the run's two answers and the exit code they give (issue 41)."""

    asked: Status                                 # the configurations given with --kv, at every tested length
    asked_configurations: list[str]
    deployable: Status                            # any tested FP8 configuration (asked, remedy, search) passes
    configuration: Optional[str]                  # the one the deploy line names (Deployment.configuration)
    passes_at: list[int]
    max_model_len: Optional[int]                  # its cap: every tested length up to it passed
    exit_code: int                                # --require plain: what compare, report and gate exit with
    exit_code_require_any: int                    # `kveval gate --require any`


class Results(FileModel):
    schema_version: int
    kveval_version: str
    model: Optional[str]
    command: Optional[str]
    verdict: Optional[VerdictRecord]              # None only when written without a verdict
    evidence: Evidence
    deployment: Optional[Deployment] = None       # absent before 2026-12-06 and when written without a verdict
    decision: Optional[Decision] = None           # absent before issue 41's exit codes and without a verdict
