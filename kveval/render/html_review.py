"""review.html: the review as one self-contained page (CSS inline, figures as data: URIs), from review.md
and the run directory that holds its figures. Operators share this one file; it fetches nothing.

Pure apart from reading the figures: markdown and a directory in, an HTML string out. The markdown is
parsed by markdown-it-py (CommonMark plus tables) with raw HTML off, so anything in the review that came
from a user or a log (model names, vLLM messages, model output) reaches the page as text, never as markup.

Stable hooks for readers and tests: #verdict (the verdict heading, also .verdict-pass / -fail /
-inconclusive), #decision (the deployable-configuration line under it), #headline (the sentence under it), #deploy (the deploy line), table.decision (the
first table). The deploy line is moved up to sit under the headline, so that the three fit the first
screen however many cells the decision table lists; the rest keeps review.md's order.
"""
from __future__ import annotations

import base64
import html
import re
from pathlib import Path
from urllib.parse import unquote, urlsplit

from markdown_it import MarkdownIt
from markdown_it.token import Token

VERDICT_PREFIX = "Verdict:"
DEPLOY_PREFIX = "Deploy"
DECISION_PREFIX = "Deployable FP8 configuration:"   # render/verdict_section.py: the second answer, not the deploy line
VERDICT_CLASSES = {"PASS": "verdict-pass", "FAIL": "verdict-fail", "INCONCLUSIVE": "verdict-inconclusive"}
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
# The one piece of raw HTML the review writes itself: a long table folded by render/markdown.folded.
DETAILS_OPEN = re.compile(r"<details><summary>(.*)</summary>")
DETAILS_CLOSE = "</details>"

# Only inline styles and data: images may load: a page that escaped something wrongly still runs no
# script and reaches no server.
CONTENT_POLICY = "default-src 'none'; img-src data:; style-src 'unsafe-inline'"

STYLE = """
:root { color-scheme: light; }
body { margin: 0; background: #f6f7f9; color: #1d2125;
       font: 15px/1.45 system-ui, -apple-system, "Segoe UI", "DejaVu Sans", sans-serif; }
main { max-width: 1180px; margin: 0 auto; padding: 12px 24px 48px; background: #fff; min-height: 100vh;
       box-sizing: border-box; }
h1 { font-size: 20px; margin: 4px 0 8px; }
h2 { font-size: 18px; margin: 28px 0 8px; border-bottom: 1px solid #e1e4e8; padding-bottom: 3px; }
h3 { font-size: 16px; margin: 20px 0 6px; }
h2#verdict { margin-top: 8px; padding: 6px 12px; border: 0; border-left: 8px solid #6a737d; background: #f1f3f5;
             font-size: 22px; }
h2.verdict-pass { border-left-color: #1a7f37; background: #e8f6ec; }
h2.verdict-fail { border-left-color: #cf222e; background: #fdecee; }
h2.verdict-inconclusive { border-left-color: #bf8700; background: #fff6dd; }
#headline { font-size: 16px; margin: 8px 0; }
#deploy { margin: 8px 0 12px; padding: 8px 12px; background: #f1f6fd; border: 1px solid #c8dcf5; border-radius: 4px; }
code { font: 13px/1.4 ui-monospace, "DejaVu Sans Mono", monospace; background: #f1f3f5; padding: 0 3px;
       border-radius: 3px; white-space: pre-wrap; overflow-wrap: anywhere; }
pre { background: #f6f8fa; padding: 8px 12px; overflow-x: auto; }
pre code { background: none; padding: 0; white-space: pre; }
.table-scroll { max-width: 100%; overflow-x: auto; margin: 8px 0; }
table { border-collapse: collapse; font-size: 13px; }
th, td { border: 1px solid #d0d7de; padding: 3px 8px; text-align: left; vertical-align: top; }
th { background: #f6f8fa; }
table.decision td:first-child { white-space: nowrap; }
img { max-width: 100%; height: auto; display: block; margin: 8px 0; }
summary { cursor: pointer; color: #0550ae; margin: 6px 0; }
.missing-figure { color: #6a737d; font-style: italic; }
"""


def review_html(markdown_text: str, run_dir: str | Path) -> str:
    """The whole page for one review; figures are read from run_dir (where review.md links them)."""
    parser = _parser()
    tokens = parser.parse(markdown_text)
    _fold_long_tables(tokens, parser)
    _mark_hooks(tokens)
    _inline_figures(tokens, Path(run_dir))
    body = parser.renderer.render(tokens, parser.options, {})
    return _page(_title(tokens), body)


def _parser() -> MarkdownIt:
    # "html": False is what makes untrusted text safe: a <script> in the markdown is shown, not run.
    parser = MarkdownIt("commonmark", {"html": False}).enable("table")
    parser.add_render_rule("table_open", _table_open)
    parser.add_render_rule("table_close", _table_close)
    return parser


def _table_open(self, tokens, idx, options, env) -> str:
    # Each table scrolls inside its own box, so a wide one never widens the page.
    return '<div class="table-scroll">' + self.renderToken(tokens, idx, options, env)


def _table_close(self, tokens, idx, options, env) -> str:
    return self.renderToken(tokens, idx, options, env) + "</div>\n"


# --- folded tables -------------------------------------------------------------------------------

def _fold_long_tables(tokens: list[Token], parser: MarkdownIt) -> None:
    """The review's own <details> lines, which raw HTML off leaves as paragraphs of text, become the
    folding block again. Only a paragraph that is exactly such a line qualifies (untrusted text reaches
    the markdown with its `<` escaped, so it cannot look like one), and the summary is rendered as
    markdown text with raw HTML still off."""
    for index in range(len(tokens) - 2, -1, -1):
        if tokens[index].type != "paragraph_open" or tokens[index + 1].type != "inline":
            continue
        content = tokens[index + 1].content
        opening = DETAILS_OPEN.fullmatch(content)
        if opening:
            markup = f"<details><summary>{parser.renderInline(opening.group(1))}</summary>\n"
        elif content == DETAILS_CLOSE:
            markup = "</details>\n"
        else:
            continue
        tokens[index:index + 3] = [Token("html_block", "", 0, content=markup)]


# --- hooks ---------------------------------------------------------------------------------------

def _block_text(tokens: list[Token], open_index: int) -> str:
    """The inline text of the block that opens at open_index (a heading or a paragraph)."""
    inline = tokens[open_index + 1] if open_index + 1 < len(tokens) else None
    return inline.content if inline is not None and inline.type == "inline" else ""


def _verdict_status(text: str) -> str | None:
    """PASS / FAIL / INCONCLUSIVE from the heading's text `Verdict: **FAIL** (`fp8` as asked)`; None when unknown."""
    words = text[len(VERDICT_PREFIX):].replace("*", " ").split()
    return words[0] if words and words[0] in VERDICT_CLASSES else None


def _mark_hooks(tokens: list[Token]) -> None:
    """ids and classes on the verdict heading, the headline under it, the deploy line and the first
    table; the deploy paragraph moved to just under the headline (see the module's docstring)."""
    verdict = next((i for i, t in enumerate(tokens) if t.type == "heading_open" and t.tag == "h2"
                    and _block_text(tokens, i).startswith(VERDICT_PREFIX)), None)
    if verdict is None:
        return
    tokens[verdict].attrSet("id", "verdict")
    status = _verdict_status(_block_text(tokens, verdict))
    tokens[verdict].attrSet("class", f"verdict {VERDICT_CLASSES[status]}" if status else "verdict")
    section_end = next((i for i in range(verdict + 1, len(tokens)) if tokens[i].type == "heading_open"), len(tokens))
    paragraphs = [i for i in range(verdict + 3, section_end) if tokens[i].type == "paragraph_open"
                  and tokens[i].level == 0]
    table = next((i for i in range(verdict + 3, section_end) if tokens[i].type == "table_open"), None)
    if table is not None:
        tokens[table].attrSet("class", "decision")
    decision = next((i for i in paragraphs if _block_text(tokens, i).startswith(DECISION_PREFIX)), None)
    if decision is not None:
        tokens[decision].attrSet("id", "decision")
        paragraphs.remove(decision)
    if not paragraphs:
        return
    headline = paragraphs[0]
    tokens[headline].attrSet("id", "headline")
    deploy = next((i for i in paragraphs if _block_text(tokens, i).startswith(DEPLOY_PREFIX)), None)
    if deploy is None:
        return
    tokens[deploy].attrSet("id", "deploy")
    if deploy != headline:
        moved = tokens[deploy:deploy + 3]        # paragraph_open, inline, paragraph_close
        del tokens[deploy:deploy + 3]
        tokens[headline + 3:headline + 3] = moved


# --- figures -------------------------------------------------------------------------------------

def _inline_figures(tokens: list[Token], run_dir: Path) -> None:
    """Every image's src becomes a data:image/png URI of the PNG it names inside run_dir; an image
    that is not such a file (missing, outside the run directory, remote, not a PNG) becomes a short
    note, so the page never fetches anything."""
    for token in tokens:
        if token.type != "inline" or not token.children:
            continue
        children = []
        for child in token.children:
            if child.type == "image":
                data = _png_bytes(run_dir, str(child.attrGet("src") or ""))
                if data is None:
                    children += _missing_figure(child)
                    continue
                child.attrSet("src", "data:image/png;base64," + base64.b64encode(data).decode("ascii"))
            children.append(child)
        token.children = children


def _png_bytes(run_dir: Path, src: str) -> bytes | None:
    parts = urlsplit(src)
    if parts.scheme or parts.netloc or not parts.path:
        return None
    root = run_dir.resolve()
    path = (root / unquote(parts.path)).resolve()
    if root not in path.parents or not path.is_file():
        return None
    data = path.read_bytes()
    return data if data.startswith(PNG_MAGIC) else None


def _missing_figure(image: Token) -> list[Token]:
    """An emphasised note in place of an image that cannot be inlined (its text escaped, like all text)."""
    alt = "".join(child.content for child in image.children or []) or image.content
    note = Token("text", "", 0, content=f"figure not available: {alt} ({image.attrGet('src') or ''})")
    return [Token("em_open", "em", 1, attrs={"class": "missing-figure"}), note, Token("em_close", "em", -1)]


# --- page ----------------------------------------------------------------------------------------

def _title(tokens: list[Token]) -> str:
    first = next((i for i, t in enumerate(tokens) if t.type == "heading_open" and t.tag == "h1"), None)
    if first is None:
        return "kveval review"
    children = tokens[first + 1].children or []
    return "".join(c.content for c in children if c.type in ("text", "code_inline")) or "kveval review"


def _page(title: str, body: str) -> str:
    return (
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
        f"<meta http-equiv=\"Content-Security-Policy\" content=\"{CONTENT_POLICY}\">\n"
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
        f"<title>{html.escape(title)}</title>\n<style>{STYLE}</style>\n</head>\n"
        f"<body>\n<main>\n{body}</main>\n</body>\n</html>\n"
    )
