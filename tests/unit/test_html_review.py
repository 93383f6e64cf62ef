"""review.html's renderer (render/html_review.py) without a browser: untrusted text stays text, figures
are inlined from the run directory and nothing else is referenced, and the hooks the browser test and
users look for are where they belong."""
from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from kveval.files.rundir import RunDir
from kveval.render.html_review import review_html
from kveval.render.markdown import escape_cell

REPORTS = Path(__file__).resolve().parents[2] / "reports"
PUBLISHED = sorted(p.parent for p in REPORTS.rglob("review.md") if "archive" not in p.parts)
PNG = b"\x89PNG\r\n\x1a\n" + b"\0" * 16   # enough for the renderer, which checks the signature only

REVIEW = """# kveval review — {model}

## Verdict: **FAIL**

**FP8 fails at 8192.**

| cell | verdict |
|:--|:--|
| fp8-8192 | **FAIL** |

Deploy: `vllm serve MODEL --kv-cache-dtype auto` (no tested FP8 configuration passed)

Why:

- {reason}

## Figures

![drawn](drawn.png)
"""


def _page(tmp_path: Path, text: str) -> str:
    return review_html(text, tmp_path)


def _body(page: str) -> str:
    return page[page.index("<body>"):]


def test_untrusted_text_is_shown_as_text_never_as_markup(tmp_path):
    model = '<script>alert("model")</script> & co'
    reason = escape_cell('vLLM said: <img src=x onerror=alert(1)> [click](javascript:alert(2)) | done')
    page = _page(tmp_path, REVIEW.format(model=model, reason=reason)
                 + '\n<script>alert("raw")</script>\n\n[link](javascript:alert(3))\n')
    body = _body(page)
    assert "<script" not in body and "<img src=x" not in body and "href=" not in body
    assert "[link](javascript:alert(3))" in body   # a link markdown-it refuses is shown as its text
    assert "&lt;script&gt;alert(&quot;raw&quot;)&lt;/script&gt;" in body
    assert "vLLM said: &lt;img src=x onerror=alert(1)&gt;" in body   # escaped once, not &amp;lt;
    assert "&amp;lt;" not in body
    title = re.search(r"<title>(.*)</title>", page).group(1)
    assert title == "kveval review — &lt;script&gt;alert(&quot;model&quot;)&lt;/script&gt; &amp; co"


def test_figures_are_inlined_and_nothing_outside_the_page_is_referenced(tmp_path):
    run = tmp_path / "run"
    (run / "plots").mkdir(parents=True)
    (run / "drawn.png").write_bytes(PNG)
    (run / "plots" / "nested.png").write_bytes(PNG)
    (run / "fake.png").write_text("not a png")
    (tmp_path / "outside.png").write_bytes(PNG)
    text = REVIEW.format(model="m", reason="r") + "\n".join([
        "", "![nested](plots/nested.png)", "", "![gone](missing.png)", "", "![escape](../outside.png)", "",
        "![remote](https://example.com/x.png)", "", "![fake](fake.png)", ""])
    body = _body(review_html(text, run))
    sources = re.findall(r'src="([^"]*)"', body)
    assert len(sources) == 2 and all(s.startswith("data:image/png;base64,") for s in sources)
    for alt in ("gone", "escape", "remote", "fake"):
        assert f"figure not available: {alt}" in body
    assert "example.com/x.png)" in body and 'src="https' not in body   # named in the note, never loaded


def test_folded_tables_fold_and_nothing_else_becomes_markup(tmp_path):
    table = "| a | b |\n|:--|:--|\n| 1 | 2 |"
    text = (f"<details><summary>13 rows: each `cell`</summary>\n\n{table}\n\n</details>\n\n"
            f"<details><summary><script>x()</script></summary>\n\n{table}\n\n</details>\n\n"
            f"{escape_cell('<details><summary>from a log</summary>')}\n")
    body = _body(_page(tmp_path, text))
    assert body.count("<details><summary>") == 2 and body.count("</details>") == 2
    assert "<details><summary>13 rows: each <code>cell</code></summary>\n<div class=\"table-scroll\"><table>" in body
    assert "<summary>&lt;script&gt;x()&lt;/script&gt;</summary>" in body
    assert "<p>&lt;details&gt;&lt;summary&gt;from a log&lt;/summary&gt;</p>" in body


def test_page_forbids_every_fetch_but_its_own_styles_and_data_images(tmp_path):
    page = _page(tmp_path, REVIEW.format(model="m", reason="r"))
    policy = re.search(r'http-equiv="Content-Security-Policy" content="([^"]*)"', page).group(1)
    assert policy.startswith("default-src 'none'") and "img-src data:" in policy
    assert "<link" not in page and "@import" not in page


def test_hooks_and_the_deploy_line_under_the_headline(tmp_path):
    body = _body(_page(tmp_path, REVIEW.format(model="m", reason="r")))
    verdict = body.index('<h2 id="verdict" class="verdict verdict-fail">Verdict: <strong>FAIL</strong></h2>')
    headline = body.index('<p id="headline"><strong>FP8 fails at 8192.</strong></p>')
    deploy = body.index('<p id="deploy">Deploy: <code>vllm serve MODEL --kv-cache-dtype auto</code>')
    table = body.index('<div class="table-scroll"><table class="decision">')
    assert verdict < headline < deploy < table < body.index("Why:")
    assert body.count('id="deploy"') == 1 and body.count("table-scroll") == 1


def test_a_review_without_a_verdict_section_renders_plainly(tmp_path):
    body = _body(_page(tmp_path, "# kveval review — m\n\nDeploy later.\n"))
    assert 'id="verdict"' not in body and 'id="deploy"' not in body and "<p>Deploy later.</p>" in body


@pytest.mark.parametrize("source", PUBLISHED, ids=[str(p.relative_to(REPORTS)) for p in PUBLISHED])
def test_every_published_review_renders_with_its_hooks_and_every_figure(source, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(source, copy, ignore=shutil.ignore_patterns("cells", "tables", "*.json", "*.json.gz"))
    text = (copy / RunDir.REVIEW_FILE).read_text(encoding="utf-8")
    body = _body(review_html(text, copy))
    for hook in ('id="verdict"', 'id="headline"', 'id="deploy"'):
        assert body.count(hook) == 1, hook
    named = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text)
    inlined = re.findall(r'src="data:image/png;base64,', body)
    assert len(inlined) == len(named) and "figure not available" not in body
    assert body.count("<details><summary>") == text.count("<details><summary>") and "&lt;details" not in body
