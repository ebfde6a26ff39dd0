"""`charlm serve`'s decoding engine: one thread decodes every running completion together, a character per step.

Dynamic batching over the KV cache. Each completion (one choice of one prompt) holds a row of a RowCache. Between
steps, completions that arrived take free rows (their prompt is encoded on its own, then copied in) and those that
finished, or whose client went away, give their rows back; each step then runs one forward pass over every running
row, each at its own position. Scoring and attention requests run on the same thread between steps, so the model is
only ever used by one thread.

Each completion draws from its own seeded generator, so a seed fixes its text whatever else is running (up to the
rounding differences of a different batch size). The windowing policy is window.py's ContextWindow, one per row.
"""

from __future__ import annotations

import collections
import math
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import torch

from charlm.data.tokenizer import StreamDecoder, Tokenizer
from charlm.decoding.options import DecodeOptions
from charlm.decoding.sampling import sample_rows, seeded_generator
from charlm.decoding.stops import StopStrings
from charlm.decoding.window import ContextWindow
from charlm.errors import UsageError
from charlm.models.decoder import Decoder

Emit = Callable[[str, Any], None]  # ("text", Piece) / ("done", finish_reason) / ("error", message), thread-safe


@dataclass
class Piece:
    """New text of one completion, with the log-probabilities of the tokens that made it (when asked for)."""

    text: str
    logprobs: list[dict[str, Any]] = field(default_factory=list)  # {"token", "logprob", "top": {token: logprob}}


@dataclass
class Completion:
    """One continuation of one prompt, and its progress."""

    prompt_ids: list[int]
    options: DecodeOptions  # max_new_tokens, temperature, top-k, top-p, seed and stop strings are used here
    logprobs: int | None  # how many alternatives to report per token; None: no log-probabilities
    emit: Emit
    end: int | None = None  # a lines model's end symbol: drawing it ends the completion ("stop"), and it is not shown
    never: tuple[int, ...] = ()  # ids never drawn (a lines model's padding and start symbols)
    cancelled: threading.Event = field(default_factory=threading.Event)
    # progress, owned by the engine thread
    tokens: list[int] = field(default_factory=list)  # the whole text so far; the last one not yet in the cache
    window: ContextWindow | None = None  # where the model's window begins (window.py's policy), set on joining
    generated: int = 0
    held: list[Piece] = field(default_factory=list)  # pieces whose text `stops` holds back (their logprobs wait)
    stops: StopStrings = field(default_factory=lambda: StopStrings([]))
    decoder: StreamDecoder | None = None
    generator: torch.Generator | None = None


class QueueFull(UsageError):
    """More completions are waiting than --max-queue allows (HTTP 429)."""


class Engine:
    """Owns the model on one thread: completions decoded in one batch, other model calls run between steps."""

    def __init__(self, module: Decoder, tokenizer: Tokenizer, max_batch: int, max_queue: int):
        self.module, self.tokenizer = module.eval(), tokenizer
        self.device = next(module.parameters()).device
        self.max_batch, self.max_queue = max_batch, max_queue
        self.cache = module.new_row_cache(max_batch, self.device)
        self.rows: list[Completion] = []  # row i of the cache holds rows[i]
        self.waiting: collections.deque[Completion] = collections.deque()
        self.calls: collections.deque[tuple[Callable[[], Any], Future]] = collections.deque()
        self.wake = threading.Condition()
        self.stopping = False
        self.steps = 0
        self.thread = threading.Thread(target=self._loop, name="charlm-engine", daemon=True)
        self.thread.start()

    # -- what the HTTP side calls (any thread) ----------------------------------------------------

    def submit(self, completions: list[Completion]) -> None:
        """Queue completions (all or none); QueueFull when the queue would pass --max-queue."""
        with self.wake:
            if len(self.waiting) + len(completions) > self.max_queue:
                raise QueueFull(
                    f"the server is busy: {len(self.waiting)} completions are queued (limit {self.max_queue}, "
                    "--max-queue); retry shortly"
                )
            self.waiting.extend(completions)
            self.wake.notify()

    def call(self, fn: Callable[[], Any]) -> Future:
        """Run fn on the engine thread between two steps; its result (or exception) through the Future."""
        future: Future = Future()
        with self.wake:
            self.calls.append((fn, future))
            self.wake.notify()
        return future

    def load(self) -> dict[str, int]:
        return {"running": len(self.rows), "queued": len(self.waiting), "steps": self.steps}

    def stop(self) -> None:
        with self.wake:
            self.stopping = True
            self.wake.notify()
        self.thread.join(timeout=10)

    # -- the engine thread ------------------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            with self.wake:
                while not (self.stopping or self.waiting or self.rows or self.calls):
                    self.wake.wait()
                if self.stopping:
                    break
                calls, self.calls = list(self.calls), collections.deque()
                joining: list[Completion] = []
                while self.waiting and len(self.rows) + len(joining) < self.max_batch:
                    joining.append(self.waiting.popleft())
            for fn, future in calls:
                self._run_call(fn, future)
            try:
                with torch.inference_mode():
                    for completion in joining:
                        self._join(completion)
                    self._drop(lambda c: c.cancelled.is_set(), None)
                    if self.rows:
                        self._step()
            except Exception as e:  # a bug must not stop the server: fail what was running, keep serving
                self._drop(lambda c: True, f"internal error while decoding: {type(e).__name__}: {e}")
        self._drop(lambda c: True, "the server is shutting down")
        for completion in self.waiting:
            completion.emit("error", "the server is shutting down")

    @staticmethod
    def _run_call(fn: Callable[[], Any], future: Future) -> None:
        if not future.set_running_or_notify_cancel():
            return
        try:
            with torch.inference_mode():
                future.set_result(fn())
        except BaseException as e:
            future.set_exception(e)

    def _join(self, c: Completion) -> None:
        """Give a new completion a row: its prompt (all but the last token) encoded, the last one fed next step."""
        if c.cancelled.is_set():
            return
        c.tokens = list(c.prompt_ids)
        c.decoder = self.tokenizer.stream_decoder()
        c.stops = StopStrings(c.options.stop)
        c.generator = seeded_generator(c.options.seed)
        row = len(self.rows)
        self.rows.append(c)
        self.cache.active = len(self.rows)
        c.window = ContextWindow(self.module)
        first = c.window.advance(len(c.tokens))
        self._encode_row(row, c.tokens[first:-1], c.window.position(first))
        if c.options.max_new_tokens == 0:
            self._finish(row, "length")

    def _encode_row(self, row: int, ids: list[int], start_pos: int) -> None:
        if not ids:
            self.cache.load_row(row, None)
            return
        single = self.module.new_cache(1, self.device)
        self.module(torch.tensor([ids], device=self.device), cache=single, start_pos=start_pos)
        self.cache.load_row(row, single)

    def _step(self) -> None:
        if not self.module.relative_positions:  # a row whose text outgrew its window jumps forward (re-encoded)
            for row, c in enumerate(self.rows):
                if c.window is not None and c.window.jumps(len(c.tokens)):
                    first = c.window.advance(len(c.tokens))
                    self._encode_row(row, c.tokens[first:-1], c.window.position(first))
        last = torch.tensor([[c.tokens[-1]] for c in self.rows], device=self.device)  # (B, 1)
        logits = self.module(last, cache=self.cache)[0][:, -1].float()  # (B, V)
        self.steps += 1
        for row, c in enumerate(self.rows):
            if c.never:
                logits[row, list(c.never)] = float("-inf")
        finished: list[tuple[int, str]] = []
        tokens = sample_rows(
            logits,
            [c.generator for c in self.rows],  # every joined row has one
            [c.options.temperature for c in self.rows],
            [c.options.top_k for c in self.rows],
            [c.options.top_p for c in self.rows],
        )
        for row, (c, token) in enumerate(zip(self.rows, tokens, strict=True)):
            if token == c.end:
                finished.append((row, "end"))
                continue
            c.tokens.append(token)
            c.generated += 1
            reason = self._deliver(c, token, logits[row] if c.logprobs is not None else None)
            if reason is None and c.generated >= c.options.max_new_tokens:
                reason = "length"
            if reason is not None:
                finished.append((row, reason))
        for row, reason in reversed(finished):  # from the end, so the rows still to finish keep their numbers
            self._finish(row, reason)

    def _deliver(self, c: Completion, token: int, logits: torch.Tensor | None) -> str | None:
        """Pass the token's text on, holding back what may begin a stop string; "stop" when one is complete."""
        assert c.decoder is not None
        piece = Piece(c.decoder.feed(token))
        if logits is not None:
            piece.logprobs.append(self._logprob(logits, token, c.logprobs or 0))
        c.held.append(piece)
        passed = c.stops.feed(piece.text)
        if c.stops.stopped or not c.stops.held:
            self._emit_text(c, passed, c.held)
            c.held = []
        return "stop" if c.stops.stopped else None

    def _emit_text(self, c: Completion, text: str, pieces: list[Piece]) -> None:
        logprobs = [lp for p in pieces for lp in p.logprobs]
        if text or logprobs:
            c.emit("text", Piece(text, logprobs))

    def _logprob(self, logits: torch.Tensor, token: int, alternatives: int) -> dict[str, Any]:
        logp = torch.log_softmax(logits, dim=-1)  # the model's own distribution (before temperature and filters)
        top: dict[str, float] = {}
        if alternatives:
            values, ids = logp.topk(min(alternatives, logp.numel()))
            top = {self._token_text(i): round(v, 6) for v, i in zip(values.tolist(), ids.tolist(), strict=True)}
        value = float(logp[token])
        return {"token": self._token_text(token), "logprob": value if math.isfinite(value) else -1e9, "top": top}

    def _token_text(self, token: int) -> str:
        if self.tokenizer.kind == "byte" and token >= 0x80:
            return f"bytes:\\x{token:02x}"  # a piece of a multi-byte character, spelled as OpenAI spells it
        return self.tokenizer.decode([token])

    def _finish(self, row: int, reason: str) -> None:
        c = self.rows[row]
        if reason in ("length", "end") and c.decoder is not None:  # what was held back was not a stop string
            self._emit_text(c, c.stops.finish(c.decoder.flush()), c.held)
        c.held = []
        c.emit("done", "stop" if reason == "end" else reason)  # the end symbol: the item is whole, as OpenAI's stop
        self._release(row)

    def _release(self, row: int) -> None:
        """Free a row, moving the last running row into it so that the running rows stay packed."""
        last = len(self.rows) - 1
        if row != last:
            self.cache.move_row(last, row)
            self.rows[row] = self.rows[last]
        self.rows.pop()
        self.cache.active = len(self.rows)

    def _drop(self, which: Callable[[Completion], bool], message: str | None) -> None:
        for row in reversed(range(len(self.rows))):
            c = self.rows[row]
            if which(c):
                if message is not None:
                    c.emit("error", message)
                self._release(row)
