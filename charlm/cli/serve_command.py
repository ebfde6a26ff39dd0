"""`charlm serve`: parse the flags, load the model once, bind the port and hand over to uvicorn (registered on the
app in charlm/cli/app.py; the server itself lives in charlm/serving/server.py)."""

from __future__ import annotations

import errno
import ipaddress
import socket
from enum import Enum
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from charlm.cli.support import (
    CHECKPOINT_HELP,
    REPLACE_HELP,
    DeviceOption,
    Precision,
    PrecisionOption,
    Unknown,
    check_replacement,
    checkpoint_path,
    needs_torch,
)
from charlm.data.tokenizer import refuse_special_replacement
from charlm.errors import UsageError

if TYPE_CHECKING:  # only for annotations: --help must not import torch or the serve extra
    from charlm.api.model import Model
    from charlm.serving.http import Served

API_KEY_ENV = "CHARLM_API_KEY"
SERVE_HINT = 'charlm serve needs FastAPI and uvicorn ({}): pip install -e ".[serve]" in your charlm checkout'


class GenerationDefaults(str, Enum):
    """Whose settings a request that leaves decoding options out gets (charlm.serving.http.sampling_defaults)."""

    model = "model"
    openai = "openai"


def serve(
    checkpoint: Annotated[Optional[str], typer.Argument(help=CHECKPOINT_HELP, show_default=False)] = None,
    host: Annotated[
        str, typer.Option(help="Address to listen on; anything but loopback lets other machines in (a warning).")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="TCP port; 0 picks a free one (printed).")] = 8000,
    api_key: Annotated[
        Optional[str],
        typer.Option(
            envvar=API_KEY_ENV,
            help=f"Require 'Authorization: Bearer KEY' on every endpoint but /health and the page's files "
            f"(or set {API_KEY_ENV}).",
            show_default=False,
        ),
    ] = None,
    model_name: Annotated[str, typer.Option(help="The model's name in the API (GET /v1/models).")] = "charlm",
    max_batch: Annotated[int, typer.Option(min=1, max=1024, help="Completions decoded together.")] = 32,
    max_queue: Annotated[int, typer.Option(min=0, help="Completions waiting for a place; beyond: HTTP 429.")] = 256,
    max_prompt: Annotated[int, typer.Option(min=1, help="Characters in a prompt or a scored text.")] = 8192,
    max_tokens: Annotated[int, typer.Option(min=1, help="Largest max_tokens a request may ask for.")] = 4096,
    max_n: Annotated[int, typer.Option(min=1, help="Completions per request (prompts x n).")] = 16,
    max_body: Annotated[int, typer.Option(min=1, help="Bytes in a request body; beyond: HTTP 413.")] = 1_000_000,
    generation_defaults: Annotated[
        GenerationDefaults,
        typer.Option(
            help="What a request that leaves temperature, top_k, top_p, max_tokens or stop out gets: the model's "
            "sampling settings, as charlm sample uses them given no options (a decoder's config sample section; an "
            "encoder-decoder's most likely target, whole), or OpenAI's defaults (temperature 1, top_p 1, max_tokens "
            "16, no stop)."
        ),
    ] = GenerationDefaults.model,
    unknown: Annotated[Unknown, typer.Option(help="Prompt characters outside the vocabulary.")] = Unknown.error,
    replace_with: Annotated[Optional[str], typer.Option(help=REPLACE_HELP)] = None,
    device: DeviceOption = "auto",
    precision: PrecisionOption = Precision.float32,
) -> None:
    """Serve a model: OpenAI-compatible /v1/completions (streaming, batched), /v1/score, /v1/attention, playground.

    The playground page is at / ; --api-key guards every endpoint but /health and the page's files.
    """
    check_replacement(replace_with)
    if max_n > max_batch:
        raise UsageError(f"--max-n ({max_n}) cannot exceed --max-batch ({max_batch}): one request must fit a batch")
    needs_torch()
    needs_serve_extra()
    from charlm.serving.http import Served
    from charlm.serving.requests import Limits

    listener = bind(host, port)
    model = load_servable(checkpoint, device, precision, replace_with, max_queue, max_n)
    limits = Limits(max_batch, max_queue, max_prompt, max_tokens, max_n, max_body)
    served = Served(limits, model_name, api_key or None, unknown.value, replace_with, generation_defaults.value)
    start(model, served, host, listener)


def needs_serve_extra() -> None:
    """FastAPI, uvicorn and the server's modules, imported before any model is read, so a missing or broken `serve`
    extra is one line naming what failed."""
    try:
        import uvicorn  # noqa: F401

        from charlm.serving import http, server  # noqa: F401
    except ImportError as error:  # named: a package of the extra may be there but broken, or one it needs missing
        raise UsageError(SERVE_HINT.format(f"cannot import {error.name or error}")) from error


def load_servable(
    checkpoint: Optional[str], device: str, precision: Precision, replace_with: str | None, max_queue: int, max_n: int
) -> Model:
    """The model to serve, refused in one line when the server could not serve it as the flags ask."""
    from charlm.api.entry import load

    model = load(checkpoint_path(checkpoint), device, precision.value)
    if model.runtime != "torch":  # the engine batches rows through torch's caches
        raise UsageError(f"{model.path} is an ONNX export: serve the checkpoint it came from or a safetensors export")
    check_replacement_known(model, replace_with)
    if not model.family.rewrites_sources and max_queue < max_n:  # a decoder queues completions (a request's at once)
        raise UsageError(
            f"--max-queue ({max_queue}) cannot be below --max-n ({max_n}): one request's completions must fit the "
            "queue; raise --max-queue or lower --max-n"
        )
    return model


def start(model: Model, served: Served, host: str, listener: socket.socket) -> None:
    """The model's app on the bound socket, announced on stderr, served by uvicorn until Ctrl-C."""
    import uvicorn

    if model.family.rewrites_sources:  # an encoder-decoder: each prompt a source, each completion its target
        from charlm.serving.encoder_decoder_app import create_encoder_decoder_app

        app = create_encoder_decoder_app(model, served)
    else:
        from charlm.serving.server import create_app

        model.require("decoder")  # an encoder is refused here, in one line, before serving
        app = create_app(model, served)
    announce(model, served, host, listener)
    config = uvicorn.Config(app, log_level="warning", access_log=False, timeout_graceful_shutdown=2)
    uvicorn.Server(config).run(sockets=[listener])


def announce(model: Model, served: Served, host: str, listener: socket.socket) -> None:
    """Where the server listens and what it serves, on stderr; a warning first when other machines can reach it."""
    from charlm.progress import stderr_console
    from charlm.serving.http import sampling_defaults

    console = stderr_console()
    bound_host, bound_port = listener.getsockname()[:2]
    url = f"http://{bound_host if ':' not in bound_host else f'[{bound_host}]'}:{bound_port}"
    if not is_loopback(host):
        console.print(
            f"warning: listening on {host}: other machines can reach this server"
            + ("" if served.api_key else f"; set --api-key (or {API_KEY_ENV}) to require a key"),
            markup=False,
        )
    page = "" if model.family.rewrites_sources else f"\n  playground  {url}/"  # an encoder-decoder has none
    key = ", key required" if served.api_key else ""
    console.print(
        f"serving {model!r}{page}\n  OpenAI API  {url}/v1  (model {served.model_name!r}{key})\n"
        f"  {sampling_defaults(model, served).sentence()}\nCtrl-C stops.",
        markup=False,
    )


def bind(host: str, port: int) -> socket.socket:
    """The listening socket, bound before the model loads, so a taken port is one clear line at once."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise UsageError(
            f"--host {host!r} is not an address or name this machine can listen on ({e.strerror})"
        ) from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as e:
        sock.close()
        if e.errno == errno.EADDRNOTAVAIL:  # the address is not one of this machine's: no port would help
            raise UsageError(
                f"cannot listen on {host}:{port} ({e.strerror}): --host must be an address this machine has, "
                "e.g. 127.0.0.1 (this machine only) or 0.0.0.0 (every interface)"
            ) from None
        raise UsageError(
            f"cannot listen on {host}:{port} ({e.strerror}): pick another --port, or 0 for a free one"
        ) from None
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def check_replacement_known(model: Any, replace_with: str | None) -> None:
    """--replace-with must be a character the model reads: checked once at start-up, since otherwise every request
    holding an unknown character would be refused for the server's own setting."""
    if replace_with is None or model.tokenizer.kind == "byte":  # every text is bytes: nothing is ever replaced
        return
    framed = model.family.rewrites_sources or model.family.item_frame(model) is not None
    if framed:  # in the vocabulary, but as padding, start and end
        refuse_special_replacement(replace_with, "--replace-with")
    if replace_with not in model.tokenizer.stoi:
        raise UsageError(
            f"--replace-with {replace_with!r} is not in the model's vocabulary: choose a character it has, or leave "
            "--replace-with out for the default"
        )


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
