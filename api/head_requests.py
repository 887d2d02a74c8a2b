"""HEAD answered as the GET of the same URL (RFC 9110, 9.3.2): probes and link checkers send
``curl -I /readyz``, and FastAPI routes only the methods they declare (405 for HEAD).

Innermost of the service's middleware: the route sees GET, so a HEAD gets the GET's status and
headers (``Content-Length`` included), while uvicorn, which still holds the request's own
scope, sends no body. A POST-only route answers HEAD as it answers GET: 405, ``Allow: POST``.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send


class HeadAsGetMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "HEAD":
            scope = {**scope, "method": "GET"}  # a copy: the server's scope stays HEAD
        await self.app(scope, receive, send)
