"""The documentation: the site builds with no warning (every link and anchor resolves, every
generated reference renders), the reference covers every policy key, the README stays a front
page, and the quickstart commands of the docs run as written."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from browser import chromium

from regional.policy import KEY_DOCS, policy_keys

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The documentation site, built once for this module with every warning an error."""
    out = tmp_path_factory.mktemp("docs") / "site"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    run = subprocess.run(
        [str(BIN / "mkdocs"), "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "WARNING" not in run.stderr
    return out


def test_the_site_builds_with_no_warning(site: Path) -> None:
    cli = (site / "reference" / "cli.html").read_text()
    assert "usage: regional inspect" in cli and "usage: regional run" in cli
    policy = (site / "reference" / "policy.html").read_text()
    assert all(key.path in policy for key in policy_keys())


class _Links(HTMLParser):
    """The `href` and `src` targets of one page, and each link's text (`anchors`)."""

    def __init__(self) -> None:
        super().__init__()
        self.targets: list[str] = []
        self.anchors: list[tuple[str, str]] = []  # (href, text)
        self._open: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.targets += [v for k, v in attrs if k in ("href", "src") and v]
        if tag == "a":
            self._open = [dict(attrs).get("href") or ""]

    def handle_data(self, data: str) -> None:
        if self._open is not None:
            self._open.append(data)

    def handle_endtag(self, tag: str) -> None:
        if tag == "a" and self._open is not None:
            href, *text = self._open
            self.anchors.append((href, " ".join("".join(text).split())))
            self._open = None


def _local_targets(page: Path) -> list[str]:
    """The links of `page` into the site itself (no scheme, not a bare #anchor)."""
    parser = _Links()
    parser.feed(page.read_text())
    return [
        t.split("#", 1)[0]
        for t in parser.targets
        if not urlsplit(t).scheme and not t.startswith(("#", "//"))
    ]


def test_every_link_of_the_site_opens_a_file_from_disk(site: Path) -> None:
    """Over file:// a directory URL shows a directory listing: every link between pages names
    a file that exists (`page.html`, not `page/`). 404.html is left out: only a web server
    shows it, and its links are absolute for that reason."""
    pages = sorted(p for p in site.rglob("*.html") if p.name != "404.html")
    sources = (ROOT / "docs").rglob("*.md")
    assert {str(p.relative_to(site)) for p in pages} >= {
        str(p.relative_to(ROOT / "docs").with_suffix(".html")) for p in sources
    }
    broken = [
        f"{page.relative_to(site)} -> {target}"
        for page in pages
        for target in _local_targets(page)
        if target and not (page.parent / target).resolve().is_file()
    ]
    assert broken == []


def test_the_site_opens_from_disk_in_a_browser(site: Path, tmp_path: Path) -> None:
    """Open the front page from disk in headless Chromium and follow links from page to page,
    as a reader of `site/index.html` would: each lands on a rendered page, never a listing."""
    page = site / "index.html"
    for link_text in ("Getting started", "Regions and fallback units", "Python API"):
        dom, _ = chromium(page, tmp_path, (1200, 900))
        assert "Index of" not in dom and "<article" in dom, page
        parser = _Links()
        parser.feed(dom)
        hrefs = [h for h, text in parser.anchors if text == link_text and h[:1] not in "#"]
        assert hrefs, f"{page.relative_to(site)} has no link to {link_text!r}"
        page = (page.parent / hrefs[0]).resolve()
        assert page.suffix == ".html" and page.is_file(), hrefs[0]
    dom, _ = chromium(page, tmp_path, (1200, 900))
    assert "SparkRuntime" in dom and "Index of" not in dom


def test_every_policy_key_is_documented() -> None:
    assert sorted(KEY_DOCS) == sorted(key.path for key in policy_keys())


def test_every_docs_page_is_in_the_navigation() -> None:
    nav = (ROOT / "mkdocs.yml").read_text()
    pages = sorted(str(p.relative_to(ROOT / "docs")) for p in (ROOT / "docs").rglob("*.md"))
    assert [p for p in pages if f": {p}" not in nav] == []


def test_the_readme_is_a_front_page() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) < 200
    for target in re.findall(r"\]\((docs/[^)#]+)", readme):
        assert (ROOT / target).is_file(), target


def _quickstart_commands() -> list[str]:
    """The shell commands of the quickstart in docs/getting-started.md, as written."""
    text = (ROOT / "docs" / "getting-started.md").read_text()
    section = text.split("## Quickstart", 1)[1].split("\n### ", 1)[0]
    blocks = re.findall(r"```sh\n(.*?)```", section, re.S)
    return [line.split("#")[0].strip() for b in blocks for line in b.splitlines() if line.strip()]


@pytest.mark.spark
def test_the_quickstart_commands_run_as_written(tmp_path: Path) -> None:
    """Run in a copy of `examples/` (so `examples/.regional/` lands there), `.venv/bin/` being
    this interpreter's directory and `/tmp/...` a directory of the test's own."""
    commands = _quickstart_commands()
    assert commands[0] == ".venv/bin/python examples/quickstart.py"
    assert len(commands) == 4
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    env = {**os.environ, "TMPDIR": str(tmp_path), "PYTHONPATH": str(ROOT)}
    outputs = []
    for command in commands:
        argv = [
            str(BIN / a[len(".venv/bin/") :])
            if a.startswith(".venv/bin/")
            else f"{tmp_path}/{a[len('/tmp/') :]}"
            if a.startswith("/tmp/")
            else a
            for a in command.split()
        ]
        run = subprocess.run(
            argv, cwd=tmp_path, capture_output=True, text=True, env=env, timeout=600, check=False
        )
        assert run.returncode == 0, f"{command}: {run.stderr[-2000:]}"
        outputs.append(run.stdout)
    assert "IDENTICAL" in outputs[0]
    assert (tmp_path / "examples" / ".regional" / "checkpoints").is_dir()
    assert re.search(r"^\s*7\s+global", outputs[3], re.M), outputs[3]  # the newest, retained


_OVERFLOW_PROBE = """<script>
window.addEventListener("load", () => {
  const blocks = [...document.querySelectorAll("pre > code")];
  const diagram = (c) => c.closest(".diagram") !== null;
  const wide = blocks
    .filter((c) => !diagram(c) && c.scrollWidth > c.clientWidth + 1).length;
  const wrapped = blocks
    .filter((c) => diagram(c) && getComputedStyle(c).whiteSpace !== "pre").length;
  document.body.setAttribute("data-wide-code-blocks", String(wide));
  document.body.setAttribute("data-diagrams", String(blocks.filter(diagram).length));
  document.body.setAttribute("data-wrapped-diagrams", String(wrapped));
});
</script>"""


def _probe(site: Path, tmp_path: Path, page: str) -> dict[str, str]:
    probe = site / page.replace(".html", ".probe.html")
    probe.write_text((site / page).read_text().replace("</body>", _OVERFLOW_PROBE + "</body>"))
    dom, _ = chromium(probe, tmp_path, (1280, 900))
    found = dict(re.findall(r'data-(wide-code-blocks|diagrams|wrapped-diagrams)="(\d+)"', dom))
    assert len(found) == 3, "the probe did not run"
    return found


@pytest.mark.parametrize(
    "page", ["event-time.html", "extending.html", "guide/pipelines.html", "joins.html"]
)
def test_code_blocks_fit_the_column(site: Path, tmp_path: Path, page: str) -> None:
    """No code block scrolls sideways in a 1280 px window (a comment at a line's end would be
    cut off): long lines wrap. Diagrams (```{.text .diagram}) are left out: they never wrap.
    Measured by a probe script in a copy of the page."""
    assert _probe(site, tmp_path, page)["wide-code-blocks"] == "0"


@pytest.mark.parametrize("page", ["joins.html", "concepts/exchange.html", "design.html"])
def test_a_diagram_keeps_its_lines(site: Path, tmp_path: Path, page: str) -> None:
    """A wrapped line would break a diagram's columns and arrows: diagrams scroll instead."""
    found = _probe(site, tmp_path, page)
    assert found["diagrams"] != "0" and found["wrapped-diagrams"] == "0"


#: The API pipelines are written with: each name's module, and the names.
PIPELINE_API = {
    "regional.dataflow.pipeline": ("Pipeline", "Stream", "KeyedStream"),
    "regional.dataflow.state": ("KeyedContext", "ValueState", "MapState"),
    "regional.dataflow.timers": ("TimerService",),
}


def _pipeline_api() -> list[tuple[str, str, object]]:
    import importlib
    import inspect

    import regional.dataflow.windows as windows

    names = [(m, n) for m, ns in PIPELINE_API.items() for n in ns]
    names += [("regional.dataflow.windows", n) for n in windows.__all__]
    out = []
    for module, name in names:
        obj = getattr(importlib.import_module(module), name)
        out.append((module, name, obj))
        if inspect.isclass(obj) and name != "WindowAssigner":
            out += [
                (module, f"{name}.{attr}", member)
                for attr, member in vars(obj).items()
                if not attr.startswith("_") and inspect.isfunction(member)
            ]
    return out


def test_every_public_name_of_the_pipeline_api_has_a_docstring_and_a_page() -> None:
    import inspect

    api = (ROOT / "docs" / "reference" / "api.md").read_text()
    undocumented = [f"{m}.{n}" for m, n, obj in _pipeline_api() if not inspect.getdoc(obj)]
    assert undocumented == []
    without_page = [
        f"{m}.{n}"
        for m, n, _ in _pipeline_api()
        if f"::: {m}.{n.split('.')[0]}\n" not in api and f"::: {m}\n" not in api
    ]
    assert without_page == []


_SEARCH_PROBE = """<script>
window.addEventListener("load", () => {
  const input = document.querySelector("input[data-md-component=search-query]");
  const started = Date.now();
  const look = () => {
    const first = document.querySelector(".md-search-result__list a");
    const meta = document.querySelector(".md-search-result__meta");
    document.body.setAttribute("data-search-meta", meta ? meta.textContent : "");
    if (first) document.body.setAttribute("data-first-result", first.getAttribute("href"));
    else if (Date.now() - started < 20000) setTimeout(look, 100);
  };
  setTimeout(() => {  // as a reader types: focus, the text, the key events
    input.focus();
    input.value = "QUERY";
    input.dispatchEvent(new Event("input", { bubbles: true }));
    input.dispatchEvent(new KeyboardEvent("keyup", { bubbles: true, key: "n" }));
    look();
  }, 500);
});
</script>"""


def _page_requests(net_log: Path) -> list[str]:
    """The network URLs a page opened from disk asked for, from Chromium's net log: the requests
    initiated by the page's origin, "null" (a file:// page's opaque origin), not Chromium's own
    background requests (update checks, accounts). file:// loads are not in the net log."""
    import json

    log = json.loads(net_log.read_text())
    start = log["constants"]["logEventTypes"]["URL_REQUEST_START_JOB"]
    by_source: dict[int, str] = {}
    pages = set()
    for event in log["events"]:
        params = event.get("params", {})
        if "url" in params:
            by_source.setdefault(event["source"]["id"], params["url"])
        if event["type"] == start and str(params.get("initiator")).startswith(("null", "file:")):
            pages.add(event["source"]["id"])
    return sorted(by_source[s] for s in pages if s in by_source)


def test_search_works_from_disk_with_no_network(site: Path, tmp_path: Path) -> None:
    """Open the front page from disk in headless Chromium with every host name unresolvable,
    type "join" in the search box: the joins page is the first result, and the page asked for
    no http(s) URL (mkdocs.yml: "no request leaves the reader's machine")."""
    import shutil as _shutil

    from browser import CHROMIUM_FLAGS

    exe = _shutil.which("chromium")
    if exe is None:
        chromium(site / "index.html", tmp_path, (1200, 900))  # skips (fails under CI), saying how
        return
    probe = site / "index.search-probe.html"
    html = (site / "index.html").read_text()
    probe.write_text(html.replace("</body>", _SEARCH_PROBE.replace("QUERY", "join") + "</body>"))
    net_log = tmp_path / "net-log.json"
    done = subprocess.run(
        [
            exe,
            *CHROMIUM_FLAGS,
            f"--user-data-dir={tmp_path / 'profile'}",
            "--host-resolver-rules=MAP * ~NOTFOUND",  # no network: no name resolves
            f"--log-net-log={net_log}",
            "--virtual-time-budget=30000",  # run the page's timers before dumping the DOM
            "--dump-dom",
            probe.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    first = re.search(r'data-first-result="([^"]*)"', done.stdout)
    meta = re.search(r'data-search-meta="([^"]*)"', done.stdout)
    assert first is not None, f"no search result; the search box says {meta and meta.group(1)!r}"
    assert first.group(1).split("#")[0] == (site / "joins.html").as_uri()
    external = [u for u in _page_requests(net_log) if u.startswith(("http:", "https:"))]
    assert external == []


_LOADS = re.compile(
    r"<(?:script|img|iframe|source|audio|video)\b[^>]*\bsrc=\"(https?:[^\"]+)\""
    r"|<link\b[^>]*\bhref=\"(https?:[^\"]+)\"[^>]*>"
)


def test_no_page_loads_anything_from_the_network(site: Path) -> None:
    """No page of the site names an http(s) script, style, image or frame to load (links a
    reader may follow are fine): what a page needs comes with the site."""
    loads = []
    for page in sorted(site.rglob("*.html")):
        for m in _LOADS.finditer(page.read_text()):
            tag = m.group(0)
            if m.group(2) is not None and re.search(r'rel="(canonical|alternate)"', tag):
                continue
            loads.append(f"{page.relative_to(site)}: {m.group(1) or m.group(2)}")
    assert loads == []
