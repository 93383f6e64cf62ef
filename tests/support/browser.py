"""Headless Chromium for the HTML review's browser test: Debian's chromium and chromium-driver (`make
install` installs them), driven by Selenium. A missing piece fails the test with one line saying which
and how to get it: a browser test that skips quietly would hide that it never ran."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
VIEWPORT = (1280, 800)
INSTALL_HINT = "run `make install` (apt-get install chromium chromium-driver; pip install -e '.[dev]')"

# Flags for a closed network and a root user: no sandbox (root), and none of Chromium's own background
# connections (updates, sync), which this machine refuses and which only slow the start.
CHROMIUM_FLAGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-extensions", f"--window-size={VIEWPORT[0]},{VIEWPORT[1]}"]


def _executable(preferred: str, name: str) -> str:
    found = preferred if Path(preferred).is_file() else shutil.which(name)
    if not found:
        pytest.fail(f"headless Chromium unavailable: {name} not found at {preferred} or on PATH; {INSTALL_HINT}",
                    pytrace=False)
    return found


def start_chromium(profile_dir: Path):
    """A headless Chromium whose viewport is exactly VIEWPORT (CSS pixels, scale 1); quit() it when done."""
    try:
        from selenium import webdriver
        from selenium.common.exceptions import WebDriverException
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        pytest.fail(f"headless Chromium unavailable: the selenium package is not installed; {INSTALL_HINT}",
                    pytrace=False)
    options = webdriver.ChromeOptions()
    options.binary_location = _executable(CHROMIUM, "chromium")
    for flag in CHROMIUM_FLAGS + [f"--user-data-dir={profile_dir}"]:
        options.add_argument(flag)
    # An explicit driver path: Selenium then never tries to download a driver of its own.
    service = Service(executable_path=_executable(CHROMEDRIVER, "chromedriver"))
    try:
        driver = webdriver.Chrome(options=options, service=service)
    except WebDriverException as error:
        first_line = (error.msg or str(error)).strip().splitlines()[0]
        pytest.fail(f"headless Chromium did not start: {first_line}", pytrace=False)
    # The window size sets the outer window; this sets the page's own viewport to the exact size.
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                           {"width": VIEWPORT[0], "height": VIEWPORT[1], "deviceScaleFactor": 1, "mobile": False})
    return driver
