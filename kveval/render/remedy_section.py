"""The review's remedy section: what `--remedy` kept in the model dtype and why (each configuration's pool is
stated in Start-up and KV pool). Pure: evidence in, markdown out.
"""
from __future__ import annotations

from kveval.files import schema
from kveval.inputs.kvspec import keep_spec
from kveval.render.markdown import bullet


def remedy_section(evidence: schema.Evidence) -> str:
    remedy = evidence.remedy
    if not (remedy and remedy.notes):
        return ""
    out = ["## Remedy", "", f"Mode `--remedy {remedy.mode}`: kveval keeps the layers whose K or V leave the FP8 "
                            "range in the model dtype (vLLM's kv_cache_dtype_skip_layers), or where none does the "
                            "outlier layers that peak near it, and judges that configuration with the same gate.", ""]
    out += [bullet(note) for note in remedy.notes]
    out += _outliers_untried(remedy.notes, evidence)
    if any(row.kv_spec for row in evidence.pools):
        # Each pool is stated once below the first screen (issue 41): in Start-up and KV pool.
        out += ["", "Each configuration's KV pool against `auto`: the decision table above and Start-up and KV pool."]
    return "\n".join(out)


def _outliers_untried(notes: list[str], evidence: schema.Evidence) -> list[str]:
    """A note of a run whose planner did not yet try outlier layers ("No remedy" beside a diagnosis that
    names some): what run/remedy.py plans for such a diagnosis now, so the review does not say both that
    nothing is to be kept and which layers to keep."""
    lines = []
    for dtype, diagnosis in evidence.diagnosis.items():
        outliers = diagnosis.outlier_layers if isinstance(diagnosis, schema.Diagnosis) else None
        if outliers and any(note.startswith(f"No remedy for {dtype}:") for note in notes):
            layers = ", ".join(map(str, outliers))
            lines.append(bullet(f"That note is this run's: its planner did not yet try outlier layers. The K/V range "
                                f"section names layer{'s' if len(outliers) > 1 else ''} {layers}, which `--remedy auto` "
                                f"now keeps when no layer clips: `--kv {keep_spec(dtype, outliers).text}`"))
    return lines
