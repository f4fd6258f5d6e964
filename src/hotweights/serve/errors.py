"""Errors in vLLM's shape, ``{"error": {"message", "type", "param", "code"}}``, for the embedded server and the
switch's front alike (Starlette only: the front is torch-free)."""

from __future__ import annotations

from http import HTTPStatus

from starlette.responses import JSONResponse

# vLLM's names for the statuses it answers (its ``create_error_response``); others: the status's phrase
ERROR_TYPES = {400: "BadRequestError", 401: "Unauthorized", 404: "NotFoundError", 422: "UnprocessableEntityError",
               500: "InternalServerError", 501: "NotImplementedError", 503: "ServiceUnavailableError"}


def error_response(status: int, message: str, param: str | None = None, kind: str | None = None) -> JSONResponse:
    return JSONResponse(status_code=status, content={"error": {
        "message": message, "type": kind or ERROR_TYPES.get(status) or HTTPStatus(status).phrase, "param": param,
        "code": status}})
