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
from typing import Any, cast

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from charlm.api.model import Model
from charlm.decoding.transduce import target_room
from charlm.errors import UsageError
from charlm.serving.http import Served, new_app, read_body, sampling_defaults, served_name
from charlm.serving.requests import BadRequest, parse_completion


def create_transducer_app(model: Model, served: Served | None = None) -> FastAPI:
    """The ASGI app serving an encoder-decoder; one request decodes at a time (its sources batched together)."""
    served = served or Served()
    limits, model_name, api_key = served.limits, served.model_name, served.api_key
    unknown, replace_with = served.unknown, served.replace_with
    app = new_app(None, api_key, "/v1/completions, /v1/models and /health")
    busy = threading.Lock()  # one transduction at a time: the model's batches are the parallelism
    waiting = [0]  # requests decoding or waiting for their turn: at most --max-queue (--max-batch does not apply)
    created = int(model.path.stat().st_mtime) if model.path.exists() else int(time.time())
    known = set(getattr(model.tokenizer, "chars", []))  # pairs are read as characters
    defaults = sampling_defaults(model, served)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "model": model_name, "busy": busy.locked()}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        m = model.config.model
        card = {"id": model_name, "object": "model", "created": created, "owned_by": "charlm"}
        card |= {"arch": m.arch, "context": m.block_size, "vocab_size": model.tokenizer.vocab_size}
        card |= {"generation_defaults": defaults.source, "sampling_defaults": defaults.fields()}
        return {"object": "list", "data": [card]}

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        body = await read_body(request, limits)
        req = parse_completion(body, limits, "", defaults)
        served_name(req.model, model_name)
        if req.options.stop:
            raise BadRequest(400, "stop is for running text; a target ends at the model's end symbol", "stop")
        if req.logprobs is not None:
            raise BadRequest(400, "logprobs are not given for rewritten targets; leave logprobs out", "logprobs")
        for source in req.prompts:
            try:
                model.encode_source(source, unknown, replace_with)
            except UsageError as e:
                raise BadRequest(400, str(e), "prompt") from None
        o = req.options
        seeds = [None if o.seed is None else o.seed + j for j in range(req.n)]

        def rewrite() -> list[list[str]]:  # choice j of every source, drawn with seed + j
            with busy:
                return [
                    cast(
                        list[str],
                        model.transduce(req.prompts, 1, o.temperature, o.top_k, o.top_p, seed, unknown, replace_with),
                    )
                    for seed in seeds
                ]

        if waiting[0] >= limits.max_queue:
            raise BadRequest(
                429,
                f"{waiting[0]} requests are waiting; the limit is {limits.max_queue} (--max-queue)",
                code="queue_full",
            )
        waiting[0] += 1
        try:
            targets = await asyncio.to_thread(rewrite)
        finally:
            waiting[0] -= 1
        capped = defaults.max_tokens is not None or body.get("max_tokens") is not None  # else the target whole
        cap = o.max_new_tokens if capped else None
        whole = [targets[j][i] for i in range(len(req.prompts)) for j in range(req.n)]
        texts = [t[:cap] for t in whole]
        room = target_room(model.config.model.block_size)  # a target this long met the context, not its end symbol
        cut = [(cap is not None and len(t) > cap) or len(t) >= room for t in whole]
        usage = {
            "prompt_tokens": sum(map(len, req.prompts)),
            "completion_tokens": sum(map(len, texts)),
            "total_tokens": sum(map(len, req.prompts)) + sum(map(len, texts)),
            "unknown_characters": sum(c not in known for p in req.prompts for c in p),
        }
        envelope = {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time())}
        envelope["model"] = model_name
        choices = [
            {"text": t, "index": k, "logprobs": None, "finish_reason": "length" if c else "stop"}
            for k, (t, c) in enumerate(zip(texts, cut, strict=True))
        ]
        if not req.stream:
            return JSONResponse({**envelope, "choices": choices, "usage": usage})

        async def stream() -> AsyncIterator[str]:  # each target whole, as one chunk: it is decoded before it is sent
            for choice in choices:
                yield f"data: {json.dumps({**envelope, 'choices': [choice]})}\n\n"
            if req.include_usage:
                yield f"data: {json.dumps({**envelope, 'choices': [], 'usage': usage})}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(stream(), media_type="text/event-stream")

    return app
