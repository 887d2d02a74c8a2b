"""Reject request bodies over ``max_body_bytes`` with 413 before they are parsed."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.problems import ProblemError


class BodyLimitMiddleware:
    """Pure ASGI middleware: counts body bytes as they arrive, raises 413 past the limit.

    The error is raised from ``receive`` inside the route, so the app's problem handlers
    answer it like any other.
    """

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length", b"")
        seen = int(declared) if declared.isdigit() else 0

        async def limited_receive() -> Message:
            nonlocal seen
            if seen > self.max_bytes:
                raise self._too_large()
            message = await receive()
            if message["type"] == "http.request" and not declared:
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise self._too_large()
            return message

        await self.app(scope, limited_receive, send)

    def _too_large(self) -> ProblemError:
        return ProblemError(
            413, "payload-too-large", f"request body exceeds {self.max_bytes} bytes"
        )
