"""``/docs``: Swagger UI from the files of the ``swagger-ui-bundle`` package (no CDN)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles
from swagger_ui_bundle import swagger_ui_path

ASSETS = "/docs/assets"

router = APIRouter(include_in_schema=False)
assets = StaticFiles(directory=swagger_ui_path)
"""Mounted at ``ASSETS`` by the app (``swagger-ui-bundle.js``, ``swagger-ui.css``, ...)."""


@router.get("/docs")
async def swagger_ui(request: Request) -> HTMLResponse:
    return get_swagger_ui_html(
        openapi_url=str(request.app.openapi_url),
        title=f"{request.app.title} - API",
        swagger_js_url=f"{ASSETS}/swagger-ui-bundle.js",
        swagger_css_url=f"{ASSETS}/swagger-ui.css",
        swagger_favicon_url=f"{ASSETS}/favicon-32x32.png",
    )
