"""Count string-key dict accesses in kveval/ (issue 42: typed models instead of dicts between layers).

What is counted, per source file under kveval/ (lm_eval_tasks/, lm-eval's own task code, left out):
  - a subscript whose index is a string literal, in any context: `facts["phases"]`, `manifest["x"] = 1`,
    `del d["k"]`;
  - a call `<expr>.get("...")` whose first argument is a string literal, except on `environ`
    (`os.environ.get("VAR")` reads the environment, not data).
The count is syntactic (ast, no types): a pandas column read `df["kv"]` counts like a dict read, as it is
the same untyped string key. Not counted: `.pop`, `.setdefault`, `in` tests, keys held in variables.

    python scripts/count_dict_access.py            # total and per package
    python scripts/count_dict_access.py --files    # and per file, most first

tests/unit/test_architecture.py runs `count()` and holds the total under a ceiling.
"""
from __future__ import annotations

import argparse
import ast
from collections import Counter
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "kveval"


def _is_str(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str)


def _accesses(tree: ast.AST) -> int:
    found = 0
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and _is_str(node.slice):
            found += 1
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
              and node.args and _is_str(node.args[0])):
            receiver = node.func.value
            name = receiver.attr if isinstance(receiver, ast.Attribute) else getattr(receiver, "id", None)
            if name != "environ":
                found += 1
    return found


def _package(path: Path) -> str:
    """kveval/analysis/diff.py -> analysis; kveval/evidence.py -> evidence."""
    parts = path.relative_to(PACKAGE).parts
    return parts[0] if len(parts) > 1 else path.stem


def count(package: Path = PACKAGE) -> dict[Path, int]:
    """Source file -> its string-key dict accesses (files with none left out)."""
    found = {}
    for path in sorted(package.rglob("*.py")):
        if "lm_eval_tasks" in path.parts:
            continue
        n = _accesses(ast.parse(path.read_text(encoding="utf-8")))
        if n:
            found[path] = n
    return found


def by_package(found: dict[Path, int]) -> Counter[str]:
    totals: Counter[str] = Counter()
    for path, n in found.items():
        totals[_package(path)] += n
    return totals


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", action="store_true", help="also list every file, most accesses first")
    args = parser.parse_args()
    found = count()
    print(f"total {sum(found.values())}")
    for name, n in by_package(found).most_common():
        print(f"  {name:<12} {n}")
    if args.files:
        for path, n in sorted(found.items(), key=lambda item: -item[1]):
            print(f"{n:6}  {path.relative_to(PACKAGE.parent)}")


if __name__ == "__main__":
    main()
