"""Cut off a request body that stops arriving: 408 after ``timeout_s`` of silence.

uvicorn waits for a declared body forever, so a client that sends its headers and two of 100
promised bytes held a connection (and its request's memory) for good (2026-12-07 fuzz). The
limit is on silence between chunks, not on the whole body, so a slow but steady upload gets
in. A head that never finishes is timed out by the server's protocol (``api/http_protocol.py``,
``REPACK_HEAD_TIMEOUT_S``), before this middleware sees the request.
"""

from __future__ import annotations

import asyncio

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.problems import ProblemError


class BodyTimeoutMiddleware:
    """Pure ASGI middleware: each ``receive`` of a request body waits ``timeout_s`` at most.

    The error is raised from ``receive`` inside the route, so the app's problem handlers
    answer it like any other (``BodyLimitMiddleware`` does the same for size)."""

    def __init__(self, app: ASGIApp, timeout_s: float) -> None:
        self.app = app
        self.timeout_s = timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        done = False

        async def timed_receive() -> Message:
            nonlocal done
            if done:  # after the body: what is left is the disconnect, which may take long
                return await receive()
            try:
                message = await asyncio.wait_for(receive(), self.timeout_s)
            except TimeoutError:
                raise ProblemError(
                    408,
                    "request-timeout",
                    f"the request body stopped arriving: nothing for {self.timeout_s:g} s",
                    headers={"Connection": "close"},
                ) from None
            if message["type"] != "http.request" or not message.get("more_body", False):
                done = True
            return message

        await self.app(scope, timed_receive, send)
