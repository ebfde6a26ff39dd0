"""What every `charlm serve` app shares: OpenAI's error shape, the API-key check, the app with its error handlers,
a request body read within its limit, the model name check, and what a request that leaves options out gets."""

from __future__ import annotations

import hmac
import json
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from charlm.data.tokenizer import UnknownPolicy
from charlm.decoding.options import DecodeOptions
from charlm.serving.requests import (
    OPENAI_DEFAULTS,
    TARGET_DEFAULTS,
    BadRequest,
    Limits,
    SamplingDefaults,
    model_defaults,
)


@dataclass(frozen=True)
class Served:
    """How a server answers, whatever its model: its limits, the name it serves under, its API key, what it does
    with characters the model never saw (refuse them, or read them as `replace_with` / the learned unknown symbol),
    and whose settings a request that leaves decoding options out gets (the model's, or OpenAI's defaults)."""

    limits: Limits = field(default_factory=Limits)
    model_name: str = "charlm"
    api_key: str | None = None
    unknown: UnknownPolicy = "error"
    replace_with: str | None = None
    generation_defaults: str = "model"  # or "openai": --generation-defaults


def sampling_defaults(model: Any, served: Served) -> SamplingDefaults:
    """What a request that leaves temperature, top_k, top_p, max_tokens or stop out gets from this server: OpenAI's
    defaults, or the model's own settings, the ones `charlm sample` decodes with given no options."""
    if served.generation_defaults == "openai":
        return OPENAI_DEFAULTS
    if model.family.rewrites_sources:
        return TARGET_DEFAULTS
    return model_defaults(DecodeOptions.from_config(model.config.sample), served.limits)


OPEN_PATHS = {"/health", "/", "/favicon.ico"}  # no key needed: the page's own files hold no model data


def error_body(message: str, param: str | None = None, code: str | None = None, kind: str = "invalid_request_error"):
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


class RequireKey:
    """401 unless `Authorization: Bearer KEY`, except on /health and the page's files.

    Plain ASGI rather than @app.middleware("http"), which would pass every streamed chunk through extra tasks.
    """

    def __init__(self, app: Any, key: str):
        self.app, self.expected = app, f"Bearer {key}".encode()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        path = scope.get("path", "")
        if scope["type"] == "http" and path not in OPEN_PATHS and not path.startswith("/playground/"):
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not hmac.compare_digest(given, self.expected):
                what = "a wrong API key" if given else "no API key"
                body = error_body(
                    f"{what}: send the header 'Authorization: Bearer KEY' with the server's --api-key",
                    kind="authentication_error",
                    code="invalid_api_key",
                )
                await JSONResponse(body, status_code=401)(scope, receive, send)
                return
        await self.app(scope, receive, send)


def new_app(lifespan: Any, api_key: str | None, endpoints: str) -> FastAPI:
    """A FastAPI app whose refusals are one line in OpenAI's error shape (an unknown path names `endpoints`), behind
    the key check when the server has a key."""
    app = FastAPI(title="charlm", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)

    @app.exception_handler(BadRequest)
    async def refused(request: Request, e: BadRequest) -> JSONResponse:
        return JSONResponse(error_body(e.message, e.param, e.code), status_code=e.status)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, e: StarletteHTTPException) -> JSONResponse:
        message = f"{request.method} {request.url.path}: {e.detail}"
        if e.status_code == 404:
            message += f"; the endpoints are {endpoints}"
        return JSONResponse(error_body(message), status_code=e.status_code)

    if api_key:
        app.add_middleware(RequireKey, key=api_key)
    return app


async def read_body(request: Request, limits: Limits) -> Any:
    """The request's JSON, refused past --max-body (declared or streamed) or when it is not JSON."""
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limits.max_body:
        raise BadRequest(413, f"the body has {declared} bytes; the limit is {limits.max_body} (--max-body)")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limits.max_body:
            raise BadRequest(413, f"the body is over the limit of {limits.max_body} bytes (--max-body)")
        chunks.append(chunk)
    try:
        return json.loads(b"".join(chunks))
    except (ValueError, UnicodeDecodeError) as e:
        raise BadRequest(400, f"the body is not valid JSON ({e})") from None
    except RecursionError:  # arrays or objects nested past Python's recursion limit: no request needs that
        raise BadRequest(400, "the body's JSON is nested too deeply") from None


def served_name(name: Any, model_name: str) -> None:
    """A request's `model` must be the served one (or left out)."""
    if name is not None and name != model_name:
        raise BadRequest(
            404, f"model {name!r} is not served here; this server serves {model_name!r}", "model", "model_not_found"
        )
