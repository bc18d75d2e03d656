"""The generated parts of the documentation site (docs/), rewritten from the code they describe.

    .venv/bin/python scripts/docs.py            # rewrite every generated part that is stale
    .venv/bin/python scripts/docs.py --check    # exit 1 naming each stale part (what the tests check)

Each part lives between `<!-- NAME:start -->` and `<!-- NAME:end -->` markers in its page, or is a whole file:

- `settings-table` in docs/reference/cli.md: every flag, variable and default (`openai_api.settings`);
- docs/reference/model-config.schema.json: the model config's JSON Schema (`openai_api.config_schema`);
- `import-table` and `module-map` in docs/contributing/architecture.md: which part of `openai_api/` imports
  which, and every module with the first sentence of its docstring, so the map of the code cannot drift from
  the tree;
- `error-table` in docs/reference/errors.md: every error class, its status, type, code and Anthropic mapping;
- `metrics-table` in docs/operations/metrics.md: every metric the gateway exports, with its labels and help;
- `bench-table` in docs/performance/index.md: the bench summary (`bench.report.readme_table` of the committed
  `bench/results/latest.json`).

The tests (tests/unit/test_settings.py, test_config_schema.py, test_docs_site.py, test_bench_readme.py) fail
when a part is stale, each naming this command.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
PACKAGE = REPO / "openai_api"
if str(REPO) not in sys.path:  # run as a script: the checkout's own code, not an installed copy
    sys.path.insert(0, str(REPO))

SCHEMA_FILE = DOCS / "reference" / "model-config.schema.json"


def _first_sentence(doc: str | None) -> str:
    """A module docstring's first sentence (its first paragraph up to the first '. '), on one line."""
    if not doc:
        return ""
    para = " ".join(doc.strip().split("\n\n")[0].split())
    end = para.find(". ")
    return para if end < 0 else para[: end + 1]


def module_map() -> str:
    """Every module of `openai_api/`, grouped by package, with its docstring's first sentence (no line counts:
    the map changes when a module comes, goes or says otherwise what it is, not with every edit)."""
    rows: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        package = "/".join(rel.parts[:-1]) or "(top level)"
        source = path.read_text(encoding="utf-8")
        doc = _first_sentence(ast.get_docstring(ast.parse(source))).replace("|", "\\|") or "(no docstring)"
        rows.setdefault(package, []).append(f"| `{rel.as_posix()}` | {doc} |")
    out: list[str] = []
    for package in sorted(rows, key=lambda p: (p != "(top level)", p)):
        out += [f"**`openai_api/{package}/`**" if package != "(top level)" else "**`openai_api/`**", "",
                "| module | what it is (its docstring) |", "|---|---|", *rows[package], ""]
    return "\n".join(out).rstrip("\n")


def _unit(module: str) -> str:
    """The part of the code a module belongs to in the import table: its sub-package, or its own name."""
    parts = module.split(".")
    if len(parts) < 2:
        return "openai_api"
    sub = parts[1]
    return f"{sub}/" if (PACKAGE / sub).is_dir() else f"{sub}.py"


def package_imports() -> str:
    """Which parts of `openai_api` each part imports (static `import` / `from` statements, at any depth)."""
    deps: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        unit = _unit(".".join(path.relative_to(REPO).with_suffix("").parts))
        found = deps.setdefault(unit, set())
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([node.module] if isinstance(node, ast.ImportFrom) and node.module and node.level == 0
                     else [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            found.update(_unit(n) for n in names if n.startswith("openai_api.") and _unit(n) != unit)
    packages = sorted(u for u in deps if u.endswith("/"))
    modules = sorted(u for u in deps if u.endswith(".py"))
    out = ["| part | imports from `openai_api` |", "|---|---|"]
    for unit in [*packages, *modules]:
        used = ", ".join(f"`{d}`" for d in sorted(deps[unit] - {"openai_api"})) or "nothing"
        out.append(f"| `{unit}` | {used} |")
    return "\n".join(out)


def error_table() -> str:
    """Every error class the app can raise (subclasses of `GatewayError` once the app is imported): its status,
    OpenAI `type` and default `code`, and what it becomes on Anthropic's routes."""
    import openai_api.app  # noqa: F401  (imports every module that defines an error class)
    from openai_api.errors import GatewayError, anthropic_error

    def walk(cls: type[GatewayError]) -> list[type[GatewayError]]:
        return [c for sub in cls.__subclasses__() for c in (sub, *walk(sub))]

    out = ["| status | `type` | `code` (default) | Anthropic's status, `type` | class |", "|---|---|---|---|---|"]
    for cls in sorted(walk(GatewayError), key=lambda c: (c.status, c.type, c.default_code or "", c.__name__)):
        status, body = anthropic_error(cls.status, "")
        code = f"`{cls.default_code}`" if cls.default_code else "(named where raised)"
        out.append(f"| {cls.status} | `{cls.type}` | {code} | {status} `{body['error']['type']}` | "
                   f"`{cls.__module__}.{cls.__name__}` |")
    return "\n".join(out)


def metrics_table() -> str:
    """Every metric the gateway itself exports (`observability.Metrics` and the keys' metrics of
    `quota.service.QuotaService`): its exposed name, type, labels and help text."""
    from prometheus_client.metrics import MetricWrapperBase

    from openai_api.observability import Metrics
    from openai_api.quota.service import QuotaService

    metrics = Metrics()
    quota = QuotaService(None, [], metrics)
    found = [m for owner in (metrics, quota) for m in vars(owner).values() if isinstance(m, MetricWrapperBase)]
    out = ["| metric | type | labels | what |", "|---|---|---|---|"]
    for m in sorted(found, key=lambda m: m._name):
        name = m._name + ("_total" if m._type == "counter" else "")
        labels = ", ".join(f"`{n}`" for n in m._labelnames)
        text = m._documentation.replace("|", "\\|")
        out.append(f"| `{name}` | {m._type} | {labels} | {text} |")
    return "\n".join(out)


def _settings_table() -> str:
    from openai_api.settings import markdown_table
    return markdown_table()


def _bench_table() -> str:
    from bench.report import readme_table
    return readme_table(json.loads((REPO / "bench" / "results" / "latest.json").read_text())).strip("\n")


# name -> (page, renderer): the text between the page's `<!-- name:start -->` and `<!-- name:end -->` lines.
MARKED: dict[str, tuple[Path, Callable[[], str]]] = {
    "settings-table": (DOCS / "reference" / "cli.md", _settings_table),
    "import-table": (DOCS / "contributing" / "architecture.md", package_imports),
    "module-map": (DOCS / "contributing" / "architecture.md", module_map),
    "bench-table": (DOCS / "performance" / "index.md", _bench_table),
    "error-table": (DOCS / "reference" / "errors.md", error_table),
    "metrics-table": (DOCS / "operations" / "metrics.md", metrics_table),
}


def marked_text(page: Path, name: str) -> str:
    """What the page holds between `name`'s markers (without the newlines next to them)."""
    text = page.read_text(encoding="utf-8")
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    if start not in text or end not in text:
        raise ValueError(f"{page.relative_to(REPO)} has no {start} ... {end} markers")
    return text.split(start, 1)[1].split(end, 1)[0].strip("\n")


def _rewrite(page: Path, name: str, content: str) -> None:
    text = page.read_text(encoding="utf-8")
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    head, rest = text.split(start, 1)
    tail = rest.split(end, 1)[1]
    page.write_text(f"{head}{start}\n{content}\n{end}{tail}", encoding="utf-8")


def stale() -> list[str]:
    """The generated parts that are not what the code renders now."""
    from openai_api.config_schema import schema_text
    out = [name for name, (page, render) in MARKED.items() if marked_text(page, name) != render()]
    if not SCHEMA_FILE.exists() or SCHEMA_FILE.read_text(encoding="utf-8") != schema_text():
        out.append(str(SCHEMA_FILE.relative_to(REPO)))
    return out


def write() -> list[str]:
    """Rewrite every stale part; returns what was rewritten."""
    from openai_api.config_schema import schema_text
    done = []
    for name, (page, render) in MARKED.items():
        content = render()
        if marked_text(page, name) != content:
            _rewrite(page, name, content)
            done.append(name)
    if not SCHEMA_FILE.exists() or SCHEMA_FILE.read_text(encoding="utf-8") != schema_text():
        SCHEMA_FILE.write_text(schema_text(), encoding="utf-8")
        done.append(str(SCHEMA_FILE.relative_to(REPO)))
    return done


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="only say what is stale (exit 1 if anything is)")
    args = parser.parse_args(argv)
    if args.check:
        found = stale()
        for name in found:
            print(f"stale: {name} (run: python scripts/docs.py)")
        return 1 if found else 0
    for name in write():
        print(f"rewrote {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
