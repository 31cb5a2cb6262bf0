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
  const wide = [...document.querySelectorAll("pre > code")]
    .filter((c) => c.scrollWidth > c.clientWidth + 1).length;
  document.body.setAttribute("data-wide-code-blocks", String(wide));
});
</script>"""


@pytest.mark.parametrize("page", ["event-time.html", "extending.html", "guide/pipelines.html"])
def test_code_blocks_fit_the_column(site: Path, tmp_path: Path, page: str) -> None:
    """No code block scrolls sideways in a 1280 px window (a comment at a line's end would be
    cut off): long lines wrap. Measured by a probe script in a copy of the page."""
    probe = site / page.replace(".html", ".probe.html")
    probe.write_text((site / page).read_text().replace("</body>", _OVERFLOW_PROBE + "</body>"))
    dom, _ = chromium(probe, tmp_path, (1280, 900))
    wide = re.search(r'data-wide-code-blocks="(\d+)"', dom)
    assert wide is not None, "the probe did not run"
    assert wide.group(1) == "0"


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
