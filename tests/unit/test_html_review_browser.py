"""review.html in a real headless Chromium (issue 41): for a published PASS, a FAIL whose deploy line is a
remedy, and an INCONCLUSIVE run, `kveval report` on a copy writes the page, and at 1280×800 the verdict,
the headline and the deploy line are shown without scrolling, the page is no wider than the window, the
figures are decoded from the page itself, and the first screen's screenshot is a real picture."""
from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from kveval.cli.commands import cli
from kveval.files.rundir import RunDir, read_json
from kveval.gate.verdict import EXIT_FOUND, EXIT_INCONCLUSIVE, EXIT_PASS
from tests.support.browser import VIEWPORT, start_chromium

REPORTS = Path(__file__).resolve().parents[2] / "reports"
PUBLISHED = [("PASS", "h100-smollm2-8192", EXIT_PASS),
             ("FAIL", "h100-qwen2.5-coder-1.5b-8192", EXIT_FOUND),     # deploys its remedy, fp8:keep=0,1
             ("INCONCLUSIVE", "cpu-demo", EXIT_INCONCLUSIVE)]

pytestmark = pytest.mark.browser

# The element's box in the viewport's coordinates, and the viewport without its scroll bars.
BOX_SCRIPT = """
const box = arguments[0].getBoundingClientRect();
const page = document.documentElement;
return {top: box.top, left: box.left, bottom: box.bottom, right: box.right,
        width: page.clientWidth, height: page.clientHeight};
"""


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    driver = start_chromium(tmp_path_factory.mktemp("chromium-profile"))
    yield driver
    driver.quit()


@pytest.fixture
def rendered(tmp_path, monkeypatch):
    """A published run copied into tmp_path and re-rendered there by `kveval report` (the copy keeps the
    published figures: KVEVAL_NO_PLOTS=1 draws none anew)."""
    monkeypatch.setenv("KVEVAL_NO_PLOTS", "1")

    def render(name: str, exit_code: int) -> Path:
        copy = tmp_path / name
        shutil.copytree(REPORTS / name, copy)
        (copy / RunDir.REVIEW_HTML_FILE).unlink(missing_ok=True)
        outcome = CliRunner().invoke(cli, ["report", str(copy)])
        assert outcome.exit_code == exit_code, outcome.output
        page = RunDir(copy).review_html_path
        assert outcome.stdout.strip() == str(RunDir(copy).review_path)   # stdout: the review's path alone
        assert f"HTML review: {page}" in outcome.stderr
        return page

    return render


def _inside_viewport(browser, element) -> None:
    box = browser.execute_script(BOX_SCRIPT, element)
    assert element.is_displayed(), element.get_attribute("id")
    assert 0 <= box["top"] and box["bottom"] <= box["height"], (element.get_attribute("id"), box)
    assert 0 <= box["left"] and box["right"] <= box["width"], (element.get_attribute("id"), box)


def _check_screenshot(path: Path) -> None:
    from PIL import Image

    data = path.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n"), "the screenshot is not a PNG"
    image = Image.open(io.BytesIO(data)).convert("RGB")
    assert image.size == VIEWPORT
    # Blank would be one colour; text, the verdict's banner and a table give many.
    colours = image.getcolors(maxcolors=VIEWPORT[0] * VIEWPORT[1])
    assert len(colours) > 50, f"the screenshot looks blank ({len(colours)} colours)"
    background = max(colours)[0]
    assert background < 0.97 * VIEWPORT[0] * VIEWPORT[1], "the screenshot is nearly all one colour"


@pytest.mark.parametrize("status, name, exit_code", PUBLISHED, ids=[p[0] for p in PUBLISHED])
def test_verdict_and_deploy_line_are_on_the_first_screen(status, name, exit_code, rendered, browser, tmp_path):
    from selenium.webdriver.common.by import By

    page = rendered(name, exit_code)
    browser.get(page.as_uri())
    verdict = browser.find_element(By.ID, "verdict")
    headline = browser.find_element(By.ID, "headline")
    deploy = browser.find_element(By.ID, "deploy")
    decision = browser.find_element(By.ID, "decision")     # the deployable configuration's answer, under the verdict
    assert verdict.text.startswith(f"Verdict: {status} (")
    assert f"verdict-{status.lower()}" in verdict.get_attribute("class").split()
    # The deploy element is the run's own deploy answer (results.json), shown as text, not markdown.
    deployment = read_json(RunDir(page.parent).results_path)["deployment"]
    # Its first line is the deploy line; the cost and notes follow in the same block (render/verdict_section._joined).
    assert deploy.text.splitlines()[0] == deployment["line"].replace("`", "")
    if status == "FAIL":
        assert "--kv-cache-dtype-skip-layers 0 1" in deploy.text   # the remedy, not plain FP8
    assert browser.execute_script("return window.scrollY") == 0
    for element in (verdict, decision, headline, deploy):
        _inside_viewport(browser, element)
    # Wide tables scroll in their own box: the page itself is never wider than the window.
    assert browser.execute_script("return document.documentElement.scrollWidth <= "
                                  "document.documentElement.clientWidth")
    figures = browser.find_elements(By.TAG_NAME, "img")
    assert figures, "a published run has figures"
    for figure in figures:
        assert figure.get_attribute("src").startswith("data:image/png;base64,")
        assert browser.execute_script("return arguments[0].complete && arguments[0].naturalWidth > 0", figure)
    # Self-contained: the page loaded nothing beyond itself.
    loaded = browser.execute_script("return performance.getEntriesByType('resource').map(e => e.name)")
    assert loaded == [], json.dumps(loaded)[:300]
    screenshot = tmp_path / f"{name}-first-screen.png"
    assert browser.save_screenshot(str(screenshot))
    _check_screenshot(screenshot)
