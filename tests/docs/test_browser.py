"""The built documentation site, opened in headless Chromium: pages a reader lands on render whole.

Slow. The site (`mkdocs build --strict`, built once per session: tests/conftest.py) is served on
localhost; each page below is opened at desktop width and checked for its title, the navigation,
images that loaded (naturalWidth > 0), same-site links (and their #anchors) that resolve, no
same-site request answered with an error, and no console error or uncaught script error. Requests
to other hosts (the theme's web fonts) are refused, as on a machine without a network, and their
failures are not counted. A full-page screenshot of each page goes to tests/artifacts/browser/
(git-ignored; the path is printed) for a person to look at.

Needs the browser extra (`pip install -e '.[browser]'`: playwright, driving the system's Chromium,
never a downloaded one) and Chromium (`apt-get install chromium`); `make test-slow` installs both.
Under CI (the CI variable set) a missing one fails the test; elsewhere it skips, saying which.
"""
import functools
import http.server
import os
import shutil
import threading
import urllib.error
import urllib.parse
import urllib.request
from typing import NamedTuple

import pytest

from tests._support import ROOT

ARTIFACTS = ROOT / "tests" / "artifacts" / "browser"
# Chromium without the services it calls home to: the network is closed on CI's machines
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage"]
VIEWPORT = {"width": 1440, "height": 900}  # wide enough for Material's left navigation and page contents
# path in the site -> the title the page must carry ("<nav title> - jaxsal"; the home page: the site name)
PAGES = {
    "": "jaxsal",
    "methods/gradcam/": "Grad-CAM - jaxsal",
    "api/jaxsal/": "jaxsal - jaxsal",
    "notebooks/quickstart/": "jaxsal quick start: explain, render, look - jaxsal",  # a notebook: its heading
    "guides/sweeps/": "Sweeps - jaxsal",
}
NAV_ENTRIES = 40  # mkdocs.yml's nav has about 50 pages; the primary navigation lists every one


def _missing_browser():
    """Why the browser check cannot run here, or None."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "playwright is not installed: pip install -e '.[browser]' (make test-slow installs it)"
    if not chromium():
        return "Chromium is not installed: apt-get install chromium (make test-slow installs it as root)"
    return None


def chromium():
    return shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="session")  # set up before the session's docs_site: a missing browser stops the test unbuilt
def browser():
    missing = _missing_browser()
    if missing:
        (pytest.fail if os.environ.get("CI") else pytest.skip)(missing)
    from playwright.sync_api import sync_playwright
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium(), headless=True, args=CHROMIUM_ARGS)
        yield b
        b.close()


class _Quiet(http.server.SimpleHTTPRequestHandler):
    overrides: dict = {}  # path -> HTML served instead of the file (the planted-faults page)

    def do_GET(self):
        body = self.overrides.get(urllib.parse.urlsplit(self.path).path)
        if body is None:
            return super().do_GET()
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def served(docs_site):
    """The built site on a free localhost port: (base URL, the handler class's overrides)."""
    assert docs_site.returncode == 0, docs_site.log
    overrides = {}
    handler = functools.partial(type("Handler", (_Quiet,), {"overrides": overrides}), directory=str(docs_site.path))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/", overrides
    server.shutdown()
    server.server_close()


class _Fetcher:
    """Same-site URLs fetched once each: (status, body text)."""

    def __init__(self):
        self.cache = {}

    def __call__(self, url):
        if url not in self.cache:
            try:
                with urllib.request.urlopen(url, timeout=30) as r:
                    ctype = r.headers.get("Content-Type", "")
                    self.cache[url] = (r.status, r.read().decode("utf-8", "replace") if "html" in ctype else "")
            except urllib.error.HTTPError as e:
                self.cache[url] = (e.code, "")
        return self.cache[url]


def _has_anchor(html, anchor):
    return any(f'{attr}="{anchor}"' in html for attr in ("id", "name"))


# what reads badly but is not broken (printed, not failed): code blocks and tables wider than the page's
# column (they scroll sideways), and notebook outputs shown as a Python repr (a picture the notebook
# converter has no template for, an image/gif)
NOTES = """[...Array.from(document.querySelectorAll('article *'))
    .filter(e => ['auto', 'scroll'].includes(getComputedStyle(e).overflowX) && e.scrollWidth > e.clientWidth + 1)
    .map(e => 'scrolls sideways: ' + e.innerText.trim().split('\\n')[0].slice(0, 60)),
  ...Array.from(document.querySelectorAll('article .jp-OutputArea-output[data-mime-type="text/plain"]'))
    .map(e => e.innerText.trim()).filter(t => /^<[\\w.]+ object( at 0x[0-9a-f]+)?>$/.test(t))
    .map(t => 'a notebook output shown as its repr: ' + t)]"""


class Checked(NamedTuple):
    title: str
    problems: list  # sentences; empty: the page is whole
    refused: set  # requests to other hosts
    notes: list  # what reads badly but is not broken (NOTES)


def check_page(browser, base, path, fetch, shot=None) -> Checked:
    """Open base+path in a new page at VIEWPORT, check it, and write a full-page screenshot to `shot`."""
    origin = urllib.parse.urlsplit(base).netloc
    page = browser.new_page(viewport=VIEWPORT)
    console, refused, bad_responses = [], set(), []

    def route(r):
        if urllib.parse.urlsplit(r.request.url).netloc == origin or r.request.url.startswith("data:"):
            r.continue_()
        else:
            refused.add(r.request.url)
            r.abort()

    page.route("**/*", route)
    page.on("console", lambda m: m.type == "error" and console.append((m.text, m.location.get("url", ""))))
    page.on("pageerror", lambda e: console.append((f"uncaught: {e}", "")))
    page.on("response", lambda r: r.status >= 400 and bad_responses.append(f"{r.status} {r.url}"))
    problems = []
    try:
        page.goto(base + path, wait_until="load")
        page.evaluate("document.querySelectorAll('img[loading=lazy]').forEach(i => i.loading = 'eager')")
        page.wait_for_load_state("networkidle")
        page.wait_for_function("Array.from(document.images).every(i => i.complete)", timeout=15_000)
        title = page.title()
        nav = page.locator("nav.md-nav--primary")
        if not nav.count() or not nav.first.is_visible():
            problems.append("no visible primary navigation")
        else:
            n = nav.first.locator("a.md-nav__link").count()
            if n < NAV_ENTRIES:
                problems.append(f"the navigation lists {n} links, fewer than {NAV_ENTRIES}")
            if not nav.first.locator(".md-nav__link--active").count():
                problems.append("the navigation does not mark this page")
        if not page.locator("article h1").count():
            problems.append("no page heading (article h1)")
        for src in page.evaluate("Array.from(document.images).filter(i => !(i.naturalWidth > 0))"
                                 ".map(i => i.getAttribute('src').slice(0, 120))"):
            problems.append(f"broken image: {src}")
        hrefs = page.evaluate("Array.from(document.querySelectorAll('a[href]')).map(a => a.href)")
        for href in sorted(set(hrefs)):
            parts = urllib.parse.urlsplit(href)
            if parts.netloc != origin:
                continue
            status, html = fetch(urllib.parse.urlunsplit(parts._replace(fragment="")))
            anchor = urllib.parse.unquote(parts.fragment)
            if status != 200:
                problems.append(f"broken link ({status}): {href}")
            elif anchor and html and not _has_anchor(html, anchor):
                problems.append(f"link to a missing anchor: {href}")
        problems += [f"same-site request answered {r}" for r in bad_responses]
        problems += [f"console error: {text} ({where})" for text, where in console if where not in refused]
        notes = page.evaluate(NOTES)
        if shot:
            page.screenshot(path=str(shot), full_page=True)
    finally:
        page.close()
    return Checked(title, problems, refused, notes)


@pytest.mark.slow
def test_the_pages_render_whole_in_chromium(browser, served):
    base, _ = served
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    print(f"\nscreenshots of the built site: {ARTIFACTS}")
    fetch, failures, refused = _Fetcher(), [], set()
    for path, want in PAGES.items():
        shot = ARTIFACTS / f"{path.strip('/').replace('/', '_') or 'home'}.png"
        checked = check_page(browser, base, path, fetch, shot)
        refused |= checked.refused
        problems = checked.problems
        if checked.title != want:
            problems.insert(0, f"title {checked.title!r}, wanted {want!r}")
        print(f"  /{path}: {shot.name}" + "".join(f"\n    {p}" for p in problems)
              + "".join(f"\n    (not a failure) {note}" for note in checked.notes))
        failures += [f"/{path}: {p}" for p in problems]
    hosts = sorted({urllib.parse.urlsplit(u).netloc for u in refused})
    print(f"  requests to other hosts refused (not counted): {', '.join(hosts) or 'none'}")
    assert not failures, "\n".join(failures)


PLANTED = """
<img src="../../images/no-such-picture.png" alt="planted">
<a href="../../guides/no-such-guide/">planted</a>
<a href="../gradcam/#no-such-section">planted</a>
<script>console.error("planted console error")</script>
<script>window.plantedMissingFunction()</script>
<pre><code>planted """ + "x" * 300 + """</code></pre>
"""


@pytest.mark.slow
def test_the_check_finds_planted_faults(browser, served, docs_site):
    """The checks can fail: a copy of the Grad-CAM page with a missing picture, a link to no page, a link
    to no section, a console error and a script that throws, served next to it, gets each reported (and a
    code line too long for the column noted)."""
    base, overrides = served
    html = (docs_site.path / "methods" / "gradcam" / "index.html").read_text()
    assert "</article>" in html
    overrides["/methods/planted/"] = html.replace("</article>", PLANTED + "</article>", 1).encode()
    checked = check_page(browser, base, "methods/planted/", _Fetcher())
    assert any(n.startswith("scrolls sideways: planted xxx") for n in checked.notes), checked.notes
    problems = checked.problems
    text = "\n".join(problems)
    assert "broken image: ../../images/no-such-picture.png" in text, text
    assert "broken link (404): " + base + "guides/no-such-guide/" in text, text
    assert "link to a missing anchor: " + base + "methods/gradcam/#no-such-section" in text, text
    picture = base + "images/no-such-picture.png"
    assert "console error: planted console error" in text, text
    assert "console error: uncaught: " in text and "plantedMissingFunction is not a function" in text, text
    assert "same-site request answered 404 " + picture in text, text
    assert "console error: Failed to load resource: the server responded with a status of 404" in text, text
    assert len(problems) == 7, text  # nothing else: the copy is otherwise the whole Grad-CAM page
