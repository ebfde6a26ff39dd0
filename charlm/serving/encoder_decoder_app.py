"""`charlm serve` for an encoder-decoder: OpenAI's completions API where each prompt is a source and each completion
its target (a word and its phonemes), rewritten by the model's own batched transduction.

The request fields are the completions fields `charlm serve` takes for a decoder, checked by the same parser; a
target ends at the model's end symbol (finish_reason "stop"; "length" when it filled the context first, or when
`max_tokens` cut it), and stop strings and logprobs, which belong to running text, are refused in one line. A request
that leaves options out gets what `charlm sample` decodes with (the most likely target, whole), or OpenAI's defaults
under --generation-defaults openai (temperature 1, max_tokens 16). Characters a source holds that the model never saw
follow the server's --unknown: refused (400, naming them), or read as the model's learned unknown symbol (--unknown
replace), their count then in the response's `usage.unknown_characters`.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from charlm.api.model import Model
from charlm.decoding.options import DecodeOptions
from charlm.decoding.rewrite import target_room
from charlm.errors import UsageError
from charlm.serving.http import Served, new_app, read_body, sampling_defaults, served_name
from charlm.serving.requests import BadRequest, CompletionRequest, parse_completion


def create_encoder_decoder_app(model: Model, served: Served | None = None) -> FastAPI:
    """The ASGI app serving an encoder-decoder; one request decodes at a time (its sources batched together)."""
    served = served or Served()
    server = EncoderDecoderServer(model, served)
    app = new_app(None, served.api_key, "/v1/completions, /v1/models and /health")
    app.get("/health")(server.health)
    app.get("/v1/models")(server.models)
    app.post("/v1/completions")(server.completions)
    return app


class EncoderDecoderServer:
    """An encoder-decoder's endpoints: the model, the server's settings, and the turn each request waits for."""

    def __init__(self, model: Model, served: Served):
        self.model, self.limits, self.model_name = model, served.limits, served.model_name
        self.unknown, self.replace_with = served.unknown, served.replace_with
        self.busy = threading.Lock()  # one transduction at a time: the model's batches are the parallelism
        # requests decoding or waiting for their turn: at most --max-queue (--max-batch does not apply)
        self.waiting = 0
        self.created = int(model.path.stat().st_mtime) if model.path.exists() else int(time.time())
        self.defaults = sampling_defaults(model, served)

    async def health(self) -> dict[str, Any]:
        return {"status": "ok", "model": self.model_name, "busy": self.busy.locked()}

    async def models(self) -> dict[str, Any]:
        m = self.model.config.model
        card = {"id": self.model_name, "object": "model", "created": self.created, "owned_by": "charlm"}
        card |= {"arch": m.arch, "context": m.block_size, "vocab_size": self.model.tokenizer.vocab_size}
        card |= {"generation_defaults": self.defaults.source, "sampling_defaults": self.defaults.fields()}
        return {"object": "list", "data": [card]}

    async def completions(self, request: Request) -> Response:
        body = await read_body(request, self.limits)
        req = self.checked_request(body)
        targets = await self.rewrite_in_turn(req)
        capped = self.defaults.max_tokens is not None or body.get("max_tokens") is not None  # else the target whole
        cap = req.options.max_new_tokens if capped else None
        choices, usage = self.answer(req, targets, cap)
        envelope = {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time())}
        envelope["model"] = self.model_name
        if not req.stream:
            return JSONResponse({**envelope, "choices": choices, "usage": usage})
        chunks = whole_target_chunks(envelope, choices, usage if req.include_usage else None)
        return StreamingResponse(chunks, media_type="text/event-stream")

    def checked_request(self, body: Any) -> CompletionRequest:
        """The completions a body asks for, refused when it asks for what a target does not have (stop strings,
        logprobs) or a source holds characters the server's --unknown refuses."""
        req = parse_completion(body, self.limits, "", self.defaults)
        served_name(req.model, self.model_name)
        if req.options.stop:
            raise BadRequest(400, "stop is for running text; a target ends at the model's end symbol", "stop")
        if req.logprobs is not None:
            raise BadRequest(400, "logprobs are not given for rewritten targets; leave logprobs out", "logprobs")
        for source in req.prompts:
            try:
                self.model.encode_source(source, self.unknown, self.replace_with)
            except UsageError as e:
                raise BadRequest(400, str(e), "prompt") from None
        return req

    async def rewrite_in_turn(self, req: CompletionRequest) -> list[list[str]]:
        """Choice j of every source, once the requests ahead are done; 429 when --max-queue are already waiting."""
        if self.waiting >= self.limits.max_queue:
            raise BadRequest(
                429,
                f"{self.waiting} requests are waiting; the limit is {self.limits.max_queue} (--max-queue)",
                code="queue_full",
            )
        self.waiting += 1
        try:
            return await asyncio.to_thread(self.rewrite, req)
        finally:
            self.waiting -= 1

    def rewrite(self, req: CompletionRequest) -> list[list[str]]:  # choice j of every source, drawn with seed + j
        """Whole targets (max_tokens cuts them afterwards, so a cut target is said to be one)."""
        o, room = req.options, self.model.config.model.block_size
        decoding = DecodeOptions(temperature=o.temperature, top_k=o.top_k, top_p=o.top_p, max_new_tokens=room)
        seeds = [None if o.seed is None else o.seed + j for j in range(req.n)]
        with self.busy:
            return [
                self.model.rewrite(req.prompts, decoding.with_(seed=seed), self.unknown, self.replace_with)
                for seed in seeds
            ]

    def answer(
        self, req: CompletionRequest, targets: list[list[str]], cap: int | None
    ) -> tuple[list[dict[str, Any]], dict[str, int]]:
        """OpenAI's choices, n per source in order, each cut to `cap` characters, and the request's usage."""
        whole = [targets[j][i] for i in range(len(req.prompts)) for j in range(req.n)]
        texts = [t[:cap] for t in whole]
        # a target this long met the context, not its end symbol
        room = target_room(self.model.config.model.block_size)
        cut = [(cap is not None and len(t) > cap) or len(t) >= room for t in whole]
        usage = {
            "prompt_tokens": sum(map(len, req.prompts)),
            "completion_tokens": sum(map(len, texts)),
            "total_tokens": sum(map(len, req.prompts)) + sum(map(len, texts)),
            "unknown_characters": sum(self.model.unseen_inputs(p) for p in req.prompts),
        }
        choices = [
            {"text": t, "index": k, "logprobs": None, "finish_reason": "length" if c else "stop"}
            for k, (t, c) in enumerate(zip(texts, cut, strict=True))
        ]
        return choices, usage


async def whole_target_chunks(
    envelope: dict[str, Any], choices: list[dict[str, Any]], usage: dict[str, int] | None
) -> AsyncIterator[str]:
    """Server-sent events: each target whole, as one chunk (it is decoded before it is sent), then the usage when
    the request asked for it, then data: [DONE]."""
    for choice in choices:
        yield f"data: {json.dumps({**envelope, 'choices': [choice]})}\n\n"
    if usage is not None:
        yield f"data: {json.dumps({**envelope, 'choices': [], 'usage': usage})}\n\n"
    yield "data: [DONE]\n\n"
