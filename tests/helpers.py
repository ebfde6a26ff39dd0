"""Helpers the tests share that need nothing of tests/conftest.py (which re-exports them): a real HTTP server for
downloads, a process frozen in place, a run folder's logged steps, token-shift weights that do something."""

from __future__ import annotations

import http.server
import json
import os
import signal
import threading
import time
from pathlib import Path


class CorpusServer:
    """A real http.server on 127.0.0.1 serving the corpus in good and broken ways."""

    def __init__(self, body: bytes):
        self.body = body
        self.requests: dict[str, int] = {}
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:
                server.requests[self.path] = server.requests.get(self.path, 0) + 1
                route = getattr(server, "route_" + self.path.strip("/").replace("-", "_"), None)
                if route is None:
                    self.send_error(404)
                else:
                    route(self, server.requests[self.path])

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        # A short poll, so that shutdown() returns at once rather than after serve_forever's default half second.
        self.thread = threading.Thread(target=lambda: self.httpd.serve_forever(poll_interval=0.02), daemon=True)

    def url(self, route: str) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/{route}"

    def _send(self, handler, body: bytes, length: int | None = None) -> None:
        handler.send_response(200)
        handler.send_header("Content-Length", str(len(body) if length is None else length))
        handler.end_headers()
        handler.wfile.write(body)

    def route_good(self, handler, count: int) -> None:
        self._send(handler, self.body)

    def route_truncated(self, handler, count: int) -> None:
        self._send(handler, self.body[: len(self.body) // 2], length=len(self.body))
        handler.close_connection = True

    def route_wrong(self, handler, count: int) -> None:
        self._send(handler, self.body[:-5] + b"XXXXX")

    def route_flaky(self, handler, count: int) -> None:
        if count == 1:
            handler.send_error(503, "try again")
        else:
            self._send(handler, self.body)


def freeze(pid: int, timeout: float = 30) -> None:
    """SIGSTOP a process and wait until it is stopped: kill() returns once the signal is sent, and a process running
    on the other core can go on for a moment (write a line, finish a step) before it stops."""
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + timeout
    while True:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return  # gone: nothing left to run on
        if state in ("T", "t", "Z", "X"):
            return
        assert time.monotonic() < deadline, f"process {pid} did not stop within {timeout} s (state {state})"
        time.sleep(0.001)


def last_logged_step(run: Path) -> int:
    """The step of the last complete line of a run folder's steps.jsonl (a line still being written is not one)."""
    lines = (run / "steps.jsonl").read_text().split("\n")[:-1]  # what follows the last newline is incomplete
    return json.loads(lines[-1])["step"]


def step_losses(run: Path) -> list[float]:
    """Every logged step loss of a run folder's metrics.jsonl, in order."""
    return [json.loads(line)["step_loss"] for line in (run / "metrics.jsonl").read_text().splitlines()]


def with_token_shift_weights(model, seed: int = 0):
    """Give every TokenShift of `model` random mix and gate vectors (they start at zero, where the shift does
    nothing, so a test of its decoding paths would prove nothing); returns the model."""
    import torch

    from charlm.models.layers import TokenShift

    generator = torch.Generator().manual_seed(seed)
    shifts = [m for m in model.modules() if isinstance(m, TokenShift)]
    assert shifts, "the model has no token shift"
    with torch.no_grad():
        for shift in shifts:
            shift.mix.copy_(torch.randn(shift.mix.shape, generator=generator))
            shift.gate.copy_(torch.randn(shift.gate.shape, generator=generator))
    return model
