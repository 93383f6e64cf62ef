"""The architecture document's layout section (docs/architecture.md, linked from the README) names every
module of the package (and nothing that is gone)."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ARCHITECTURE = ROOT / "docs" / "architecture.md"


def _layout_block() -> str:
    text = ARCHITECTURE.read_text(encoding="utf-8")
    section = text[text.index("## Layout\n"):]
    return section[section.index("```\n") + 4:section.index("\n```", section.index("```\n") + 4)]


def test_layout_names_every_module():
    block = _layout_block()
    modules = [p.relative_to(ROOT / "kveval").as_posix() for p in sorted((ROOT / "kveval").rglob("*.py"))
               if p.name != "__init__.py" or p.parent == ROOT / "kveval"]
    missing = [m for m in modules if m not in block and not (m.startswith("worker/phases/") or
                                                              m.startswith("inputs/lm_eval_tasks/"))]
    assert not missing, f"docs/architecture.md layout lacks {missing}"


def test_layout_names_nothing_that_is_gone():
    named = re.findall(r"^\s+([\w/]+\.py)\b", _layout_block(), flags=re.M)
    gone = [name for name in named if not (ROOT / "kveval" / name).is_file()]
    assert named and not gone, f"docs/architecture.md layout names missing modules {gone}"


def test_readme_is_for_users():
    """The README stays short (300 lines at most), keeps the two quick-start commands that the Makefile
    defines and CI runs (`.ci/run` runs the README's test command), and links the architecture doc."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 300, f"README.md has {len(readme.splitlines())} lines (at most 300)"
    assert "make demo" in readme and "make test" in readme
    assert "make test" in (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert "docs/architecture.md" in readme, "README does not link docs/architecture.md"
