"""OpenAI-style errors: ``{"error": {"message", "type", "param", "code"}}`` with a status."""

from __future__ import annotations

from typing import Any

from aiohttp import web


class APIError(Exception):
    """An error that becomes a JSON response; raise it anywhere in a handler."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type_: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
        close: bool = False,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type_
        self.param = param
        self.code = code
        self.headers = headers or {}
        self.close = close  # close the connection after the response

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }

    def response(self) -> web.Response:
        response = web.json_response(self.body(), status=self.status, headers=self.headers)
        if self.close:
            response.force_close()
        return response


def bad_request(message: str, param: str | None = None, code: str = "invalid_value") -> APIError:
    return APIError(400, message, param=param, code=code)


def not_found(message: str, code: str = "not_found") -> APIError:
    return APIError(404, message, code=code)


def overloaded(message: str, retry_after: int = 1) -> APIError:
    return APIError(
        503,
        message,
        type_="server_overloaded",
        code="overloaded",
        headers={"Retry-After": str(retry_after)},
    )


_HTTP_CODES = {
    400: ("invalid_request_error", "bad_request"),
    401: ("authentication_error", "invalid_api_key"),
    404: ("invalid_request_error", "not_found"),
    405: ("invalid_request_error", "method_not_allowed"),
    413: ("invalid_request_error", "request_too_large"),
    415: ("invalid_request_error", "unsupported_media_type"),
}


def from_http_exception(exc: web.HTTPException) -> APIError:
    """aiohttp's own errors (unknown route, body too large) as OpenAI-style JSON."""
    type_, code = _HTTP_CODES.get(exc.status, ("invalid_request_error", "http_error"))
    message = {
        404: "unknown route",
        405: "method not allowed for this route",
        413: f"request body too large: {exc.text}" if exc.text else "request body too large",
    }.get(exc.status, exc.reason or "request failed")
    headers = {k: v for k, v in exc.headers.items() if k.lower() == "allow"}
    return APIError(exc.status, message, type_=type_, code=code, headers=headers)
