"""A real `charlm serve` process on a free loopback port, for the server, load and browser tests."""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from conftest import REPO


class ServerProcess:
    """`python -m charlm serve CKPT --port 0 ARGS` started, its address read from what it prints."""

    def __init__(self, checkpoint: Path, *args: str, env: dict | None = None):
        full_env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
        full_env.pop("CHARLM_API_KEY", None) if not env or "CHARLM_API_KEY" not in env else None
        self.process = subprocess.Popen(
            [sys.executable, "-m", "charlm", "serve", str(checkpoint), "--port", "0", *args],
            env=full_env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.banner = ""
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            line = self.process.stderr.readline()
            if not line:
                raise RuntimeError(f"charlm serve exited {self.process.wait()}:\n{self.banner}")
            self.banner += line
            if found := re.search(r"OpenAI API\s+(http://[^/]+)/v1", line):
                self.url = found.group(1)
                self.host, port = self.url.removeprefix("http://").rsplit(":", 1)
                self.port = int(port)
                return
        raise RuntimeError(f"charlm serve did not start in time:\n{self.banner}")

    def request(self, method: str, path: str, body=None, headers: dict | None = None, raw: bytes | None = None):
        """(status, parsed JSON or text) of one request on a fresh connection."""
        connection = http.client.HTTPConnection(self.host, self.port, timeout=60)
        payload = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        connection.request(method, path, body=payload, headers={"Content-Type": "application/json", **(headers or {})})
        response = connection.getresponse()
        data = response.read().decode()
        connection.close()
        try:
            return response.status, json.loads(data)
        except ValueError:
            return response.status, data

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
        self.process.stdout.close()
        self.process.stderr.close()
        return self.process.wait()
