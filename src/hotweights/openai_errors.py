"""Errors in vLLM's shape, ``{"error": {"message", "type", "param", "code"}}``, for the embedded server and the
switch's front alike (Starlette only: the front is torch-free)."""

from __future__ import annotations

import json
from http import HTTPStatus

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse

# vLLM's names for the statuses it answers (its ``create_error_response``); others: the status's phrase
ERROR_TYPES = {400: "BadRequestError", 401: "Unauthorized", 404: "NotFoundError", 422: "UnprocessableEntityError",
               500: "InternalServerError", 501: "NotImplementedError", 503: "ServiceUnavailableError"}


def error_response(status: int, message: str, param: str | None = None, kind: str | None = None) -> JSONResponse:
    return JSONResponse(status_code=status, content={"error": {
        "message": message, "type": kind or ERROR_TYPES.get(status) or HTTPStatus(status).phrase, "param": param,
        "code": status}})


async def http_error(_request: Request, exc: Exception) -> JSONResponse:
    """An unknown path or method, answered as vLLM does: JSON, its type the status's phrase."""
    assert isinstance(exc, HTTPException)  # the only exception this handler is registered for
    return error_response(exc.status_code, str(exc.detail), kind=HTTPStatus(exc.status_code).phrase)


async def server_error(_request: Request, exc: Exception) -> JSONResponse:
    """Anything a handler did not catch (a bug, a model that cannot answer), answered as vLLM does: JSON, one line
    (the traceback goes to the log, as Starlette raises it on)."""
    return error_response(500, f"{type(exc).__name__}: {exc}".splitlines()[0][:500])


def stream_error(message: str, status: int = 500) -> bytes:
    """The event vLLM ends a stream with when it fails: the error as ``data:``, then ``[DONE]``."""
    event = {"error": {"message": message, "type": ERROR_TYPES.get(status) or HTTPStatus(status).phrase,
                       "param": None, "code": status}}
    return f"data: {json.dumps(event)}\n\ndata: [DONE]\n\n".encode()
