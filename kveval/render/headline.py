"""The review's first sentence: per KV configuration, where it passes or fails, and the KV capacity
a passing one buys against `auto` — e.g. "FP8 fails at 8192 and 32768; FP8 with layer 0 kept in
bfloat16 passes at 8192 and 32768 and holds 1.9× the `auto` pool". Pure: verdict + evidence in."""
from __future__ import annotations

from kveval.analysis.cell_records import BASELINE_KV, stored_spec
from kveval.analysis.deploy_choice import choose
from kveval.analysis.deploy_cost import deployment_cost
from kveval.analysis.deploy_facts import concurrent_requests, search_note
from kveval.files import schema
from kveval.gate import FAIL, INCONCLUSIVE, NOT_STARTED, PASS, Verdict
from kveval.gate.decision import asked_configurations, decide
from kveval.inputs.slo import parse_slo

_WORDS = {PASS: "passes", FAIL: "fails", INCONCLUSIVE: "is inconclusive", NOT_STARTED: "did not start",
          "MISSING": "has no result"}


def _lengths(values: list[int]) -> str:
    values = [f"{v}" for v in sorted(values)]
    return values[0] if len(values) == 1 else ", ".join(values[:-1]) + " and " + values[-1]


def pool_ratio(pools: list[schema.PoolRow], spec: str, lengths: list[int]) -> tuple[float | None, bool]:
    """Smallest pool ratio spec / auto over `lengths` (measured, else from vLLM's estimate)."""
    ratios, estimated = [], False
    for row in pools:
        if row.kv_spec == spec and row.max_model_len in lengths:
            ratio = row.ratio
            if ratio is None and row.fallback_ratio is not None:
                ratio, estimated = row.fallback_ratio, True
            if ratio is not None:
                ratios.append(ratio)
    return (min(ratios) if ratios else None), estimated


def _no_gain(by_spec: dict[str, dict[str, list[int]]], evidence: schema.Evidence) -> list[str]:
    """Passing specs whose pool is known and no larger than `auto`'s (every layer kept, say): nothing to deploy
    them for, since FP8 is only worth its precision for the KV it frees."""
    out = []
    for kv, statuses in by_spec.items():
        ratio = pool_ratio(evidence.pools, kv, statuses[PASS])[0] if statuses.get(PASS) else None
        if ratio is not None and ratio <= 1.0:
            out.append(kv)
    return out


def longest_passing(statuses: dict[str, list[int]]) -> int | None:
    """The longest max_model_len a deployment may be capped at: every tested length up to it passed (a pass at
    32768 above a failure at 8192 does not make 32768 safe: requests of 8192 tokens would be served too)."""
    tested = sorted((length, status) for status, lengths in statuses.items() for length in lengths)
    cap = None
    for length, status in tested:
        if status != PASS:
            break
        cap = length
    return cap


def _candidates(by_spec: dict[str, dict[str, list[int]]], evidence: schema.Evidence) -> list[str]:
    """The passing specs with more KV than `auto`, passing from their shortest tested length up."""
    no_gain = set(_no_gain(by_spec, evidence))
    return [kv for kv, statuses in by_spec.items()
            if statuses.get(PASS) and kv not in no_gain and longest_passing(statuses) is not None]


def _capacity_key(kv: str, by_spec: dict[str, dict[str, list[int]]], evidence: schema.Evidence) -> tuple:
    """Larger pool first; among equal pools fewer kept layers, then the checkpoint's own scales over a calibrated copy."""
    spec = stored_spec(kv)
    return (pool_ratio(evidence.pools, kv, by_spec[kv][PASS])[0] or 0.0, -len(spec.keep), not spec.scaled)


def _deployable(by_spec: dict[str, dict[str, list[int]]], evidence: schema.Evidence) -> str | None:
    """The passing spec that holds the most KV (largest pool ratio to `auto`), if any passes with more than `auto`
    from its shortest tested length up."""
    passing = _candidates(by_spec, evidence)
    return max(passing, key=lambda kv: _capacity_key(kv, by_spec, evidence)) if passing else None


def _specs_by_status(verdict, evidence: schema.Evidence) -> dict[str, dict[str, list[int]]]:
    """Per tested KV configuration: status -> the max_model_len values where its cells got it."""
    by_spec: dict[str, dict[str, list[int]]] = {}
    for name, status in verdict.cells.items():
        facts = evidence.cells.get(name)
        kv = facts.kv_spec if facts else None
        if kv and kv != BASELINE_KV:
            by_spec.setdefault(kv, {}).setdefault(status, []).append(int(facts.max_model_len or 0))
    return by_spec


def deployment(verdict, evidence: schema.Evidence, enforce_eager: bool = False,
               vllm_version: str | None = None, prefer: str = "capacity", slo: list[str] | None = None) -> schema.Deployment:
    """The configuration to deploy as vLLM's own flags: among the passing ones, the one `prefer` and `slo` pick
    (analysis/deploy_choice: by default the one that holds the most KV), capped at the longest max_model_len up
    to which every tested length passed, with the engine settings its cells ran with that differ from vLLM's
    defaults (eager mode, the attention backend), and what it costs against `auto` (analysis/deploy_cost);
    where none passes, the cache the model already runs with (`auto`), and why."""
    by_spec = _specs_by_status(verdict, evidence)
    choice = choose(_candidates(by_spec, evidence), lambda kv: _capacity_key(kv, by_spec, evidence),
                    lambda kv: longest_passing(by_spec[kv]), evidence, prefer, parse_slo(slo))
    spec = choice.configuration
    keep = f"vllm serve MODEL --kv-cache-dtype {BASELINE_KV}"
    common = {"vllm_version": vllm_version, "enforce_eager": enforce_eager, "attention_backend": None,
              "max_model_len": None, "passes_at": [], "pool_ratio": None, "configuration": None, "vllm_serve": keep}
    if spec is None:
        no_gain = _no_gain(by_spec, evidence)
        if no_gain:
            named = ", ".join(f"`{kv}`" for kv in no_gain)
            line = (f"Deploy: `{keep}` ({named} passed but holds no more KV than `{BASELINE_KV}`: nothing to gain "
                    "from it)")
        elif verdict.status == "FAIL":
            line = f"Deploy: `{keep}` (no tested FP8 configuration passed: keep the model dtype's KV cache)"
        else:
            line = f"Deploy until decided: `{keep}` (no FP8 configuration has passed yet)"
        return schema.Deployment(line=line, **common)
    passes_at = sorted(by_spec[spec][PASS])
    cap, backend = longest_passing(by_spec[spec]), _backend(spec, evidence)
    command = (f"vllm serve {_served_model(spec, evidence)} {stored_spec(spec).vllm_flags()} --max-model-len {cap}"
               f"{' --enforce-eager' if enforce_eager else ''}{f' --attention-backend {backend}' if backend else ''}")
    verified = f"; verified on vLLM {vllm_version}" if vllm_version else ""
    return schema.Deployment(**{**common, "line": f"Deploy (passes at {_lengths(passes_at)}{verified}): `{command}`",
                                "configuration": spec, "vllm_serve": command, "max_model_len": cap, "passes_at": passes_at,
                                "pool_ratio": pool_ratio(evidence.pools, spec, passes_at)[0],
                                "attention_backend": backend,
                                **_cost_and_choice(spec, cap, evidence, prefer, slo, choice)})


def _cost_and_choice(spec: str, cap: int, evidence: schema.Evidence, prefer: str, slo: list[str] | None,
                     choice) -> dict:
    """The cost, the choice and the requests at once, each only where known (a Deployment of a run before
    issue 41 keeps its keys where nothing was measured)."""
    fields: dict = {}
    cost = deployment_cost(spec, cap, evidence)
    if cost is not None:
        fields["cost"] = cost
    if prefer != "capacity" or slo:
        fields["preference"] = prefer
    if slo:
        fields.update(slo=list(slo), goodput=choice.goodput)
    held, seqs, note = concurrent_requests(spec, cap, evidence)
    if seqs is not None:
        fields.update(max_num_seqs=seqs, concurrent_requests=held)
    notes = [*choice.notes, *([note] if note else []), *([n] if (n := search_note(spec, evidence)) else [])]
    if notes:
        fields["notes"] = notes
    return fields


def deployment_of(verdict, evidence: schema.Evidence, manifest: schema.Manifest | None) -> schema.Deployment:
    """The deploy answer with the run's own engine settings and choice (--prefer, --slo): what the review,
    results.json and `gate --json` state."""
    options = manifest.options if manifest is not None else None
    prefer = (options.prefer if options is not None else None) or "capacity"   # absent: the default, capacity
    return deployment(verdict, evidence, bool(options and options.enforce_eager),
                      manifest.versions.vllm if manifest is not None else None, prefer,
                      options.slo if options is not None else None)


def deployment_lines(deploy: schema.Deployment) -> list[str]:
    """The deploy line, then its cost and notes, one short line each (the review's first screen)."""
    return [deploy.line, *([deploy.cost.line] if deploy.cost is not None else []), *deploy.notes]


def decision_of(verdict, evidence: schema.Evidence, manifest: schema.Manifest | None,
                deployment: schema.Deployment | None = None) -> schema.Decision:
    """The run's two answers (asked configurations, deployable configuration) and its exit code, as the
    review's verdict lines, results.json, `gate --json` and every command's exit state them."""
    deployment = deployment if deployment is not None else deployment_of(verdict, evidence, manifest)
    return decide(verdict, evidence, deployment, asked_configurations(evidence, manifest))


def _served_model(spec: str, evidence: schema.Evidence) -> str:
    """MODEL, or for a calibrated spec the checkpoint copy that carries its scales (what passed)."""
    scaled = stored_spec(spec).scaled
    entry = (evidence.calibration or {}).get(scaled) if scaled else None
    return entry.path if entry is not None else "MODEL"


def _backend(spec: str, evidence: schema.Evidence) -> str | None:
    """The attention backend the spec's cells ran on when it was not the default (worker/engine.py
    moves cells with kept layers off FlashAttention on a GPU): what passed is what is deployed."""
    backends = sorted({str(facts.attention_backend_flag) for facts in evidence.cells.values()
                       if facts.kv_spec == spec and facts.attention_backend_flag})
    return backends[0] if len(backends) == 1 else None


def headline(verdict: Verdict, evidence: schema.Evidence, model_dtype: str = "the model dtype") -> str:
    by_spec = _specs_by_status(verdict, evidence)
    if not by_spec:
        return f"Nothing was judged: no tested cell besides `{BASELINE_KV}`."
    if evidence.cells and not any(cell.started for cell in evidence.cells.values()):
        return (f"No cell started, the `{BASELINE_KV}` baseline included: vLLM could not start this model here in "
                "any KV configuration (see Start-up for its words); nothing was judged.")
    sentences = []
    for kv, statuses in by_spec.items():
        spec = stored_spec(kv)
        parts = [f"{_WORDS[s]} at {_lengths(statuses[s])}" for s in (FAIL, PASS, INCONCLUSIVE, NOT_STARTED, "MISSING")
                 if statuses.get(s)]
        sentence = f"{spec.label(model_dtype)} " + ", ".join(parts)
        if statuses.get(PASS):
            ratio, estimated = pool_ratio(evidence.pools, kv, statuses[PASS])
            if ratio is not None:
                sentence += (f" and holds {'at least ' if len(statuses[PASS]) > 1 else ''}{ratio:.2g}× the "
                             f"`{BASELINE_KV}` pool" + (" (from vLLM's estimate)" if estimated else ""))
        sentences.append(sentence)
    text = "; ".join(sentences) + "."
    statuses = [s for by_status in by_spec.values() for s in by_status]
    defects = verdict.defects
    for defect in defects:
        text += (f" {defect.cell} looks broken (a defect of the engine path or of kveval, not FP8 damage), "
                 "so it was not judged as FP8 quality.")
    # "Nothing tried passes" only when every configuration tried was judged and failed: an
    # undecided or broken remedy is not a failed one.
    judged = {s for s in statuses if s != NOT_STARTED}
    if not _deployable(by_spec, evidence) and judged == {FAIL} and len(by_spec) > 1 and not defects:
        text += " Nothing tried passes."
    for note in (evidence.remedy.notes if evidence.remedy else []):
        if note.startswith("No remedy"):
            text += f" {note}."
    return text
