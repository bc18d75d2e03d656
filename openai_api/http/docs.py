"""The API's interactive docs served whole by the gateway: `/docs` (Swagger UI) and `/redoc` (ReDoc) with their
scripts, styles and icon from `/docs/static/` (the files the `fastapi-offline` package ships), never from a CDN,
so they load on a cluster with no way out. Neither page asks for anything else: Swagger UI's online validator
badge is off and ReDoc's web fonts are not linked. `--no-docs` leaves both out (`/openapi.json` stays).
"""

from __future__ import annotations

from importlib.resources import files

from fastapi import FastAPI
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from starlette.requests import Request
from starlette.responses import HTMLResponse
from starlette.staticfiles import StaticFiles

STATIC = "/docs/static"
# The pages' own policy: scripts and styles from this origin only (Swagger UI's bootstrap script is inline).
CSP = ("default-src 'self'; script-src 'self' 'unsafe-inline'; style-src 'self' 'unsafe-inline'; "
       "img-src 'self' data:; worker-src 'self' blob:; font-src 'self' data:")


def install_docs(app: FastAPI) -> None:
    """Add `/docs`, `/redoc` and `/docs/static/` to `app` (built with `docs_url=None, redoc_url=None`)."""
    folder = files("fastapi_offline") / "static"
    app.mount(STATIC, StaticFiles(directory=str(folder)), name="docs-static")
    title = app.title

    @app.get("/docs", include_in_schema=False)
    async def swagger(request: Request) -> HTMLResponse:
        page = get_swagger_ui_html(openapi_url=_openapi_url(request, app), title=f"{title} - docs",
                                   swagger_js_url=f"{STATIC}/swagger-ui-bundle.js",
                                   swagger_css_url=f"{STATIC}/swagger-ui.css",
                                   swagger_favicon_url=f"{STATIC}/favicon.png",
                                   swagger_ui_parameters={"validatorUrl": None})
        page.headers["Content-Security-Policy"] = CSP
        return page

    @app.get("/redoc", include_in_schema=False)
    async def redoc(request: Request) -> HTMLResponse:
        page = get_redoc_html(openapi_url=_openapi_url(request, app), title=f"{title} - ReDoc",
                              redoc_js_url=f"{STATIC}/redoc.standalone.js",
                              redoc_favicon_url=f"{STATIC}/favicon.png", with_google_fonts=False)
        page.headers["Content-Security-Policy"] = CSP
        return page


def _openapi_url(request: Request, app: FastAPI) -> str:
    return str(request.scope.get("root_path", "")) + (app.openapi_url or "/openapi.json")
