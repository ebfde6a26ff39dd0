"""`charlm serve`: a trained model behind OpenAI's completions API, a scoring and an attention endpoint, and the
playground page, on FastAPI + uvicorn (the `serve` extra).

Every refused request gets a 4xx and OpenAI's error shape, {"error": {"message", "type", "param", "code"}}, whose
message is one line naming what is wrong; the server keeps serving.
"""

from __future__ import annotations

import asyncio
import collections
import json
import math
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from importlib import resources
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from charlm.api.model import Model
from charlm.errors import UsageError
from charlm.serving.engine import Completion, Engine, Piece, QueueFull
from charlm.serving.http import Served, error_body, new_app, read_body, sampling_defaults, served_name
from charlm.serving.requests import BadRequest, CompletionRequest, parse_completion, parse_text


class Mailbox:
    """The engine thread's events handed to the event loop: one wake-up for all that arrived since the last one.

    The engine emits a character for every running completion each step; waking the loop once per character
    (call_soon_threadsafe) costs more than the step itself once a dozen clients stream.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop, self.waiting, self.scheduled = loop, collections.deque(), False  # type: ignore[var-annotated]

    def post(self, queue: asyncio.Queue, item: Any) -> None:  # any thread
        self.waiting.append((queue, item))
        if not self.scheduled:
            self.scheduled = True
            self.loop.call_soon_threadsafe(self._deliver)

    def _deliver(self) -> None:  # the event loop
        self.scheduled = False  # before draining: a post from now on schedules another delivery
        while self.waiting:
            queue, item = self.waiting.popleft()
            queue.put_nowait(item)


PAGE_FILES = {"index.html": "text/html", "playground.js": "text/javascript", "playground.css": "text/css"}
SHARED_FILES = {"charlm-page.js": "text/javascript", "charlm-page.css": "text/css"}  # the web export's too


ENDPOINTS = "/v1/completions, /v1/models, /v1/score, /v1/attention, /health and /"


def create_app(model: Model, served: Served | None = None) -> FastAPI:
    """The ASGI app serving `model`; its engine thread starts with the app and stops with it."""
    served = served or Served()
    server = DecoderServer(model, served)
    app = new_app(server.lifespan, served.api_key, ENDPOINTS)
    app.get("/health")(server.health)
    app.get("/v1/models")(server.models)
    app.post("/v1/completions")(server.completions)
    app.post("/v1/score")(server.score)
    app.post("/v1/attention")(server.attention)
    app.get("/")(page)
    app.get("/playground/{name}")(page_asset)
    return app


class DecoderServer:
    """A decoder's endpoints: the model, the server's settings, and, while the app runs, the engine thread that
    decodes every running completion and the mailbox that hands its events to the event loop."""

    engine: Engine  # both set when the app starts (lifespan), which FastAPI does before any request
    mailbox: Mailbox

    def __init__(self, model: Model, served: Served):
        self.model, self.limits, self.model_name = model, served.limits, served.model_name
        self.unknown, self.replace_with = served.unknown, served.replace_with
        # a lines model: each completion is a whole item, from its start symbol
        self.frame = model.family.item_frame(model)
        self.created = int(model.path.stat().st_mtime) if model.path.exists() else int(time.time())
        self.defaults = sampling_defaults(model, served)

    @asynccontextmanager
    async def lifespan(self, app: FastAPI) -> AsyncIterator[None]:
        model, limits = self.model, self.limits
        self.engine = Engine(model.decoder, model.tokenizer, limits.max_batch, limits.max_queue)
        self.mailbox = Mailbox(asyncio.get_running_loop())
        try:
            yield
        finally:
            self.engine.stop()

    # -- what every endpoint shares ----------------------------------------------------------------

    async def read_json(self, request: Request) -> Any:
        return await read_body(request, self.limits)

    def encode(self, text: str, param: str) -> list[int]:
        try:
            return self.model.encode_prompt(text, self.unknown, self.replace_with)
        except UsageError as e:
            code = "unknown_character" if self.model.tokenizer.unknown_chars(text) else "invalid_prompt"  # an empty one
            raise BadRequest(400, str(e), param, code) from None

    def check_model(self, name: Any) -> None:
        served_name(name, self.model_name)

    async def on_engine(self, fn: Any) -> Any:
        try:
            return await asyncio.wrap_future(self.engine.call(fn))
        except UsageError as e:
            raise BadRequest(400, str(e)) from None

    # -- endpoints ---------------------------------------------------------------------------------

    async def health(self) -> dict[str, Any]:
        return {"status": "ok", "model": self.model_name, **self.engine.load()}

    async def models(self) -> dict[str, Any]:
        model, m = self.model, self.model.config.model
        card = {
            "id": self.model_name,
            "object": "model",
            "created": self.created,
            "owned_by": "charlm",
            "context": m.block_size,
            "vocab_size": model.tokenizer.vocab_size,
            "unit": model.tokenizer.unit,
            "layers": m.n_layer,
            "width": m.n_embd,
            "parameters": model.module.num_params(),
            "items": self.frame is not None,
            "generation_defaults": self.defaults.source,
            "sampling_defaults": self.defaults.fields(),
        }
        return {"object": "list", "data": [card]}

    async def completions(self, request: Request) -> Response:
        body = await self.read_json(request)
        req = parse_completion(body, self.limits, "" if self.frame else "\n", self.defaults)
        self.check_model(req.model)
        prompt_ids = [self.encode(p, "prompt") for p in req.prompts]
        events: asyncio.Queue = asyncio.Queue()
        jobs = self.completion_jobs(req, prompt_ids, events)
        try:
            self.engine.submit(jobs)
        except QueueFull as e:
            raise BadRequest(429, str(e), code="queue_full") from None
        reply = Reply(req, jobs, prompt_ids, self.model_name, [len(p) for p in req.prompts])
        if req.stream:
            return StreamingResponse(reply.stream(events), media_type="text/event-stream")
        try:
            return JSONResponse(await reply.whole(events, request))
        finally:
            reply.cancel()

    def completion_jobs(
        self, req: CompletionRequest, prompt_ids: list[list[int]], events: asyncio.Queue
    ) -> list[Completion]:
        """The engine's jobs for a request: n per prompt, choice j seeded with seed + j, each posting its events as
        (choice index, kind, value) to `events`; a lines model's each framed as a whole item."""
        mailbox, frame = self.mailbox, self.frame

        def emitter(index: int) -> Any:
            return lambda kind, value: mailbox.post(events, (index, kind, value))

        def job(ids: list[int], options: Any, index: int) -> Completion:
            if frame is None:
                return Completion(ids, options, req.logprobs, emitter(index))
            capped = options.with_(max_new_tokens=frame.cap(len(ids), options.max_new_tokens))
            return Completion(frame.prompt(ids), capped, req.logprobs, emitter(index), frame.end, frame.never)

        seeds = [None if req.options.seed is None else req.options.seed + j for j in range(req.n)]
        return [
            job(ids, req.options.with_(seed=seeds[j]), i * req.n + j)
            for i, ids in enumerate(prompt_ids)
            for j in range(req.n)
        ]

    async def score(self, request: Request) -> dict[str, Any]:
        model, body = self.model, await self.read_json(request)
        text = parse_text(body, self.limits)  # a malformed body, `model` included, is a 400 before a model name's 404
        self.check_model(body.get("model"))
        ids = self.encode(text, "text")
        tokens, each = await self.on_engine(lambda: model.family.surprisal(model, ids))  # a lines model: the item whole
        nats = [x for x in each if x is not None]
        mean = sum(nats) / len(nats)
        return {
            "model": self.model_name,
            "unit": model.tokenizer.unit,
            "tokens": tokens,
            "surprisal_bits": [None if x is None else round(x / math.log(2), 4) for x in each],
            "nats_per_char": mean,
            "bits_per_char": mean / math.log(2),
            "scored": len(nats),
        }

    async def attention(self, request: Request) -> dict[str, Any]:
        model, body = self.model, await self.read_json(request)
        prompt = parse_text(body, self.limits, field="prompt")
        self.check_model(body.get("model"))
        ids = self.encode(prompt, "prompt")
        # the text the model reads, --replace-with's characters in place (or --unknown skip's gone): Model.attention
        # encodes it again, and must get these ids, not its own default replacement's
        read = model.tokenizer.decode(ids)
        weights = await self.on_engine(lambda: model.attention(read, self.unknown))
        chars = [model.tokenizer.decode([i]) for i in ids]
        return {
            "chars": chars,
            "layers": list(range(weights.size(0))),
            "heads": list(range(weights.size(1))),
            "weights": weights.tolist(),
        }


async def page() -> Response:
    return page_file("index.html")


async def page_asset(name: str) -> Response:
    return page_file(name)


def page_file(name: str) -> Response:
    if name in SHARED_FILES:  # what the playground shares with the exported web page, kept beside that page
        folder, media = resources.files("charlm.storage").joinpath("web"), SHARED_FILES[name]
    elif name in PAGE_FILES:
        folder, media = resources.files("charlm.serving").joinpath("playground"), PAGE_FILES[name]
    else:
        raise BadRequest(404, f"no playground file {name!r}")
    text = folder.joinpath(name).read_text(encoding="utf-8")
    return Response(text, media_type=media, headers={"Cache-Control": "no-cache"})


class Reply:
    """One completions request's answer: OpenAI's response object, or its stream of chunks."""

    def __init__(self, req: CompletionRequest, jobs: list[Completion], prompt_ids: list, name: str, offsets: list):
        self.req, self.jobs, self.name = req, jobs, name
        self.prompt_tokens = sum(len(ids) for ids in prompt_ids)
        self.offsets = [offsets[i // req.n] for i in range(len(jobs))]  # text_offset: after the prompt
        self.id, self.created = f"cmpl-{uuid.uuid4().hex}", int(time.time())

    def cancel(self) -> None:
        for job in self.jobs:
            job.cancelled.set()

    def logprobs(self, index: int, piece: Piece) -> dict[str, Any] | None:
        if self.req.logprobs is None:
            return None
        offsets = []
        for lp in piece.logprobs:
            offsets.append(self.offsets[index])
            self.offsets[index] += len(lp["token"]) if not lp["token"].startswith("bytes:") else 0
        return {
            "tokens": [lp["token"] for lp in piece.logprobs],
            "token_logprobs": [lp["logprob"] for lp in piece.logprobs],
            "top_logprobs": [lp["top"] for lp in piece.logprobs],
            "text_offset": offsets,
        }

    def envelope(self, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "text_completion",
            "created": self.created,
            "model": self.name,
            "choices": choices,
        }

    def usage(self) -> dict[str, int]:
        generated = sum(job.generated for job in self.jobs)
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": generated,
            "total_tokens": self.prompt_tokens + generated,
        }

    async def stream(self, events: asyncio.Queue) -> AsyncIterator[str]:
        """Server-sent events in OpenAI's chunk format, ending with data: [DONE]; a client gone cancels its jobs."""
        try:
            remaining = len(self.jobs)
            while remaining:
                chunks, ready = [], [await events.get()]
                while not events.empty():  # all that is ready goes out in one write
                    ready.append(events.get_nowait())
                for index, kind, value in ready:
                    remaining -= kind != "text"
                    if kind == "error":
                        chunks.append(sse(error_body(value, kind="server_error")))
                        continue
                    done = kind == "done"
                    text = "" if done else value.text
                    lp = None if done else self.logprobs(index, value)
                    choice = {"text": text, "index": index, "logprobs": lp, "finish_reason": value if done else None}
                    chunks.append(sse(self.envelope([choice])))
                yield "".join(chunks)
            if self.req.include_usage:
                yield sse({**self.envelope([]), "usage": self.usage()})
            yield "data: [DONE]\n\n"
        finally:
            self.cancel()

    async def whole(self, events: asyncio.Queue, request: Request) -> dict[str, Any]:
        texts: list[list[str]] = [[] for _ in self.jobs]
        lps: list[list[dict]] = [[] for _ in self.jobs]
        reasons: list[str | None] = [None] * len(self.jobs)
        remaining = len(self.jobs)
        while remaining:
            try:
                index, kind, value = await asyncio.wait_for(events.get(), timeout=0.5)
            except asyncio.TimeoutError:
                if await request.is_disconnected():  # nobody to answer: free the rows now
                    self.cancel()
                    return {}
                continue
            if kind == "error":
                raise BadRequest(500, value, code="server_error")
            if kind == "done":
                reasons[index], remaining = value, remaining - 1
            else:
                texts[index].append(value.text)
                if (lp := self.logprobs(index, value)) is not None:
                    lps[index].append(lp)
        choices = [
            {
                "text": "".join(t),
                "index": i,
                "logprobs": merge_logprobs(lps[i]) if self.req.logprobs is not None else None,
                "finish_reason": reasons[i],
            }
            for i, t in enumerate(texts)
        ]
        return {**self.envelope(choices), "usage": self.usage()}


def merge_logprobs(parts: list[dict[str, Any]]) -> dict[str, Any]:
    keys = ("tokens", "token_logprobs", "top_logprobs", "text_offset")
    return {key: [item for part in parts for item in part[key]] for key in keys}


def sse(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload)}\n\n"
