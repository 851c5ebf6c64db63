"""The documentation site (issue 27 item 2): ``mkdocs build --strict`` succeeds on the repository (every
link and anchor resolves, the generated CLI / configuration / API pages render), and the built site, served
over HTTP, opens in a real headless browser (Debian's Chromium through selenium) with its pages' headings
and every image loaded."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
# the pages the browser opens: path → (a word of the page's <title>, its <h1>, whether it must hold an image)
PAGES = {
    "": ("silofl", "silofl", False),
    "concepts/protocols/": ("protocols", "The three protocols", False),
    "reference/cli/": ("Command line", "Command line", False),
    "reference/config/": ("Configuration", "Configuration", False),
    "privacy_utility/": (
        "Privacy",
        "Privacy–utility: every method at ε = 1, 3, 8 per site, on pixels and on DP-friendly features",
        True,
    ),
    "tabular/": ("Tabular", None, True),
}


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The site, built once with ``mkdocs build --strict`` from the repository's mkdocs.yml."""
    try:
        import material  # noqa: F401
        import mkdocs  # noqa: F401
        import mkdocstrings  # noqa: F401
    except ImportError as e:
        pytest.fail(f"the docs extra is not installed ({e}): pip install -e '.[docs]' (scripts/test.sh does)")
    out = tmp_path_factory.mktemp("docs") / "site"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "PYTHONPATH": str(ROOT / "src")}
    t = time.perf_counter()
    r = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(ROOT / "mkdocs.yml"), "-d", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, f"mkdocs build --strict failed:\n{r.stdout[-3000:]}\n{r.stderr[-6000:]}"
    print(f"mkdocs build --strict: {time.perf_counter() - t:.1f} s")
    return out


@pytest.mark.slow
def test_the_site_builds_strict_with_its_generated_pages(site):
    import yaml

    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"]

    def pages(item):
        if isinstance(item, str):
            yield item
        elif isinstance(item, dict):
            for v in item.values():
                yield from pages(v)
        else:
            for v in item:
                yield from pages(v)

    listed = set(pages(nav))
    for md in listed:  # every page of the nav is built
        html = site / ("index.html" if md == "index.md" else md.removesuffix(".md") + "/index.html")
        assert html.is_file(), md
    # every existing top-level docs page (the generated results, the threat model) is in the nav, by its name
    assert {p.name for p in (ROOT / "docs").glob("*.md")} <= listed
    cli = (site / "reference/cli/index.html").read_text()
    for text in (
        "silofl run",
        "silofl deploy local",
        "silofl site init",
        "--target-epsilon",
        "silofl pubsub publish",
    ):
        assert text in cli, text
    config = (site / "reference/config/index.html").read_text()
    assert "RunConfig" in config and "MethodOptions" in config
    from silofl.fl.registry import methods

    for name, info in methods().items():  # every registered method and its options, from the dataclasses
        assert f"<code>{name}</code>" in config and info.options.__name__ in config, name
    for option in ("target_epsilon", "noise_multiplier", "dml_alpha", "server_lr", "self_weight"):
        assert f"<code>{option}</code>" in config, option
    # the tutorial is the plug-in test itself, included at build time
    assert "silofl_fedmedian" in (site / "howto/extend/index.html").read_text()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def served(site):
    """The built site served by ``python -m http.server`` on a free loopback port, in its own process."""
    port = _free_port()
    p = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", str(site)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}/"
    try:
        for _ in range(100):
            try:
                urllib.request.urlopen(base, timeout=2).close()
                break
            except (urllib.error.URLError, ConnectionError):
                time.sleep(0.1)
        else:
            pytest.fail("http.server did not answer")
        yield base
    finally:
        p.terminate()
        p.wait(10)


@pytest.mark.slow
def test_the_site_opens_in_a_headless_browser(served, tmp_path):
    if not (CHROMIUM.exists() and CHROMEDRIVER.exists()):
        pytest.skip(
            "Debian's Chromium is not installed (apt-get install -y chromium chromium-driver; "
            "scripts/test.sh does as root)"
        )
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    opts = webdriver.ChromeOptions()
    opts.binary_location = str(CHROMIUM)
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        f"--user-data-dir={tmp_path / 'profile'}",
    ):
        opts.add_argument(flag)
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=opts)
    driver.set_page_load_timeout(60)
    try:

        def images():
            return driver.execute_script(
                "return Array.from(document.images)"
                ".map(i => [i.currentSrc || i.src, i.complete, i.naturalWidth]);"
            )

        for path, (title, h1, has_image) in PAGES.items():
            driver.get(served + path)
            WebDriverWait(driver, 30).until(
                lambda d: d.execute_script("return document.readyState") == "complete"
            )
            WebDriverWait(driver, 30).until(lambda d: all(done for _, done, _ in images()))
            assert "404" not in driver.title and title in driver.title, (path, driver.title)
            heading = driver.find_element(By.CSS_SELECTOR, "article h1").text.strip()
            assert heading and (h1 is None or heading == h1), (path, heading)
            imgs = images()
            assert not has_image or imgs, f"{path}: no image"
            broken = [src for src, _, width in imgs if width == 0]
            assert not broken, f"{path}: images that did not load: {broken}"
        # the checks can fail: a page that is not there is a 404, and a missing image has no width
        driver.get(served + "no-such-page/")
        assert "404" in driver.title or "not found" in driver.page_source.lower()
        driver.execute_script(
            "const i = document.createElement('img'); i.id = 'gone'; i.src = '/gone.png';"
            "document.body.appendChild(i);"
        )
        WebDriverWait(driver, 30).until(
            lambda d: d.execute_script("return document.getElementById('gone').complete")
        )
        assert driver.execute_script("return document.getElementById('gone').naturalWidth") == 0
    finally:
        driver.quit()
