"""The documentation site (mkdocs.yml, docs/) builds with `mkdocs build --strict`, offline, and the site it
builds loads nothing from another host; its generated parts are what the code renders now; README.md is the
front page that links into it.

The build runs in this process (mkdocs' own command line, through click's runner), so tests/conftest.py's
guard fails it if anything connects to an address other than loopback: the build itself is offline. Strict
mode fails on a broken internal link or anchor and on a page left out of the nav."""

from __future__ import annotations

import importlib.util
import re
from html.parser import HTMLParser
from pathlib import Path
from types import ModuleType

import pytest
from click.testing import CliRunner
from mkdocs.__main__ import cli as mkdocs_cli

from tests.helpers import REPO


def script(name: str) -> ModuleType:
    """A module of scripts/ (not a package), loaded from its file."""
    spec = importlib.util.spec_from_file_location(f"scripts_{name}", REPO / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def docs_tool() -> ModuleType:
    return script("docs")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    result = CliRunner().invoke(
        mkdocs_cli, ["build", "--strict", "--config-file", str(REPO / "mkdocs.yml"), "--site-dir", str(out)],
        env={"NO_MKDOCS_2_WARNING": "1"}, catch_exceptions=False)
    assert result.exit_code == 0, f"mkdocs build --strict failed:\n{result.output}"
    return out


# Elements and attributes through which a page makes the browser fetch something (not <a href>: a link is
# followed only when the reader clicks it).
_FETCHED = {"script": ("src",), "img": ("src", "srcset"), "iframe": ("src",), "source": ("src", "srcset"),
            "video": ("src", "poster"), "audio": ("src",), "embed": ("src",), "object": ("data",),
            "input": ("src",), "track": ("src",), "use": ("href", "xlink:href"), "image": ("href", "xlink:href")}


class _Assets(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        names = _FETCHED.get(tag, ())
        if tag == "link":  # stylesheets, icons, preloads, manifests, fonts: all fetched
            names = ("href",)
        self.urls += [u.strip() for n in names if (v := found.get(n)) for u in re.split(r",\s*", v)]
        if found.get("style"):
            self.urls += re.findall(r"url\(\s*['\"]?([^'\")]+)", found["style"] or "")


def _external(url: str) -> bool:
    """Whether fetching `url` leaves the site: a scheme other than data:, or a protocol-relative //host."""
    url = url.split()[0] if url else url  # srcset: "URL 2x"
    return url.startswith("//") or (bool(re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", url)) and not url.startswith("data:"))


def test_the_site_builds_strict_and_offline(site: Path) -> None:
    pages = list(site.rglob("*.html"))
    assert (site / "index.html").exists() and len(pages) >= 30
    assert (site / "reference" / "model-config.schema.json").exists()  # the schema is published with the pages


def test_the_site_loads_nothing_from_another_host(site: Path) -> None:
    fetched: dict[str, list[str]] = {}
    for page in site.rglob("*.html"):
        parser = _Assets()
        parser.feed(page.read_text(encoding="utf-8"))
        assert parser.urls, f"{page} fetches nothing: the asset parser read no page"
        bad = [u for u in parser.urls if _external(u)]
        if bad:
            fetched[str(page.relative_to(site))] = bad
    assert not fetched, f"pages fetch assets from other hosts: {fetched}"
    for css in site.rglob("*.css"):
        text = css.read_text(encoding="utf-8")
        refs = re.findall(r"url\(\s*['\"]?([^'\")]+)", text) + re.findall(r"@import\s+['\"]([^'\"]+)", text)
        assert not [r for r in refs if _external(r)], f"{css} loads from another host"
    # No CDN or web-font host is named anywhere in what the browser runs or reads (Material's bundle carried
    # two run-time unpkg loaders: scripts/mkdocs_hooks.py makes them inert), and no source map is shipped.
    cdn_hosts = script("mkdocs_hooks").CDN_HOSTS
    for path in site.rglob("*"):
        if path.suffix in (".html", ".js", ".css", ".json", ".xml", ".svg"):
            text = path.read_text(encoding="utf-8", errors="replace")
            named = [h for h in cdn_hosts if h in text]
            assert not named, f"{path.relative_to(site)} names {named}"
    assert not list(site.rglob("*.map"))
    assert not re.search(r"fonts\.(googleapis|gstatic)\.com", "".join(
        p.read_text(encoding="utf-8", errors="replace") for p in site.rglob("*.html")))


def test_the_generated_parts_are_current() -> None:
    """The settings table, the module map and import table, the bench table and the model-config schema are
    what `scripts/docs.py` renders from the code now (each also has its own test; this one names them all)."""
    assert docs_tool().stale() == [], "docs are stale: run `.venv/bin/python scripts/docs.py`"


def test_the_module_map_lists_every_module() -> None:
    tool = docs_tool()
    page, _ = tool.MARKED["module-map"]
    text = tool.marked_text(page, "module-map")
    for path in (REPO / "openai_api").rglob("*.py"):
        rel = path.relative_to(REPO / "openai_api").as_posix()
        assert f"| `{rel}` |" in text, f"{rel} is not in the module map: run `.venv/bin/python scripts/docs.py`"
    assert text == tool.module_map(), "the module map is stale: run `.venv/bin/python scripts/docs.py`"
    assert tool.marked_text(page, "import-table") == tool.package_imports(), (
        "the import table is stale: run `.venv/bin/python scripts/docs.py`")


# README.md is the front page: short, the two set-up commands as they are, and every link it has resolves.
README = (REPO / "README.md").read_text(encoding="utf-8")


def test_the_readme_is_a_front_page() -> None:
    assert len(README.splitlines()) <= 250
    blocks = re.findall(r"```bash\n(.*?)```", README, re.S)
    commands = [line.split("#")[0].strip() for b in blocks for line in b.splitlines()]
    assert "bash scripts/run.sh" in commands and "bash scripts/test.sh" in commands
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    assert "bash scripts/test.sh" in ci  # CI runs exactly the README's test command


def test_every_readme_link_resolves() -> None:
    links = re.findall(r"\]\(([^)\s]+)\)", README)
    local = [link for link in links if not re.match(r"^[a-z]+:", link)]
    assert len(local) >= 10, "the front page links into the docs"
    for link in local:
        path, _, anchor = link.partition("#")
        target = REPO / path if path else REPO / "README.md"
        assert target.exists(), f"README links to {link}, which does not exist"
        if anchor and target.suffix == ".md":
            slugs = {_slug(h) for h in re.findall(r"^#+ (.+)$", target.read_text(encoding="utf-8"), re.M)}
            assert anchor in slugs, f"README links to {link}: no such heading"


def _slug(heading: str) -> str:
    """The anchor Python-Markdown's toc (and GitHub) gives a heading, for the headings used here."""
    text = re.sub(r"[`*]", "", heading).strip().lower()
    text = re.sub(r"[^\w\s-]", "", text)
    return re.sub(r"[\s]+", "-", text)
