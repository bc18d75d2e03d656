"""MkDocs hooks (mkdocs.yml `hooks:`): the built site loads nothing from another host.

Material's JavaScript bundle carries two loaders that fetch from unpkg.com at run time: a ResizeObserver
polyfill (only in a browser without ResizeObserver) and mermaid (only on a page with a mermaid diagram; this
site has none). Neither fires here, but a site meant to be read offline, or behind a strict Content Security
Policy, must not depend on that: each such URL is replaced by an empty inline script (`data:`), so nothing
can reach a CDN, and the source maps (which embed the same sources) are left out. The build fails if any
CDN or web-font host is still named in what it wrote (tests/unit/test_docs_site.py checks the output too).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

# Hosts a documentation theme fetches assets from. None may appear in the built site.
CDN_HOSTS = ("unpkg.com", "cdn.jsdelivr.net", "cdnjs.cloudflare.com", "fonts.googleapis.com", "fonts.gstatic.com",
             "use.fontawesome.com", "code.jquery.com", "polyfill.io")
_LOADER_URL = re.compile(r"https://unpkg\.com/[^\"'`\s)]*")
_EMPTY_SCRIPT = "data:text/javascript,"
_SOURCE_MAP = re.compile(r"\n?//# sourceMappingURL=\S+\s*$")


def on_post_build(config: Any, **_: Any) -> None:
    site = Path(config["site_dir"])
    for path in site.rglob("*.map"):
        path.unlink()
    for path in site.rglob("*.js"):
        text = path.read_text(encoding="utf-8")
        new = _SOURCE_MAP.sub("", _LOADER_URL.sub(_EMPTY_SCRIPT, text))
        if new != text:
            path.write_text(new, encoding="utf-8")
    left = [f"{p.relative_to(site)}: {host}" for p in site.rglob("*") if p.is_file() and p.suffix in
            (".html", ".js", ".css", ".json", ".xml", ".svg") for host in CDN_HOSTS
            if host in p.read_text(encoding="utf-8", errors="replace")]
    if left:
        raise RuntimeError("the built site names a CDN or web-font host: " + "; ".join(left))
