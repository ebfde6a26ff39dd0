"""Load on `charlm serve`: concurrent streaming clients against one, time to first character, and a killed client.

    python scripts/bench_serve.py                  # runs/cpu (train it with plain `charlm train`), prints figures
    python scripts/bench_serve.py runs/cpu --record   # and appends them to docs/benchmarks.md

A real server process on a free loopback port; clients stream /v1/completions (server-sent events) over plain
HTTP connections, each counting the characters it receives. Rounds alternate, one client alone then N together,
so both sides of the ratio see the same machine. Then one client is a separate process killed with SIGKILL
mid-stream, and N more streams must complete with every character. Exits non-zero when a stream comes back short.
"""

from __future__ import annotations

import argparse
import http.client
import json
import math
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import append_section

KILLED_CLIENT = """
import http.client, json, sys
c = http.client.HTTPConnection(sys.argv[1], int(sys.argv[2]))
body = {"model": "charlm", "prompt": "JULIET:", "max_tokens": 4096, "stream": True}
c.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
r = c.getresponse()
while b"data:" not in r.readline():
    pass
print("streaming", flush=True)
while True:
    r.readline()
"""


@dataclass
class Stream:
    """What one streaming client saw."""

    chars: int = 0
    first_char_s: float = float("nan")  # from sending the request to the first character
    total_s: float = float("nan")
    finish_reason: str | None = None
    done: bool = False  # the stream ended with `data: [DONE]`


class Server:
    """`python -m charlm serve CKPT --port 0` in its own process, its address read from what it prints."""

    def __init__(self, checkpoint: str, tree: Path | None = None):
        """tree: another commit's files (--against), whose charlm the process imports instead of this one's."""
        env = {**os.environ, "PYTHONPATH": str(tree)} if tree else None
        self.process = subprocess.Popen(
            [sys.executable, "-m", "charlm", "serve", str(Path(checkpoint).resolve()), "--port", "0"],
            cwd=tree,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self.process.stderr is not None
        printed = ""
        for line in self.process.stderr:
            printed += line
            if found := re.search(r"OpenAI API\s+http://([^/]+):(\d+)/v1", line):
                self.host, self.port = found.group(1), int(found.group(2))
                return
        raise SystemExit(f"charlm serve exited {self.process.wait()}:\n{printed}")

    def health(self) -> dict:
        connection = http.client.HTTPConnection(self.host, self.port, timeout=30)
        connection.request("GET", "/health")
        return json.loads(connection.getresponse().read())

    def stop(self) -> None:
        self.process.send_signal(signal.SIGINT)
        try:
            self.process.wait(20)
        except subprocess.TimeoutExpired:
            self.process.kill()


def stream(server: Server, chars: int, seed: int) -> Stream:
    """One streaming completion of `chars` characters.

    The client reads what arrives in large pieces and parses the events after the stream has ended (only the first
    piece is looked at at once, for the first character's time), so that the client's own work on this 2-core machine
    takes as little as possible from the server it measures; total_s ends when `data: [DONE]` arrived.
    """
    seen = Stream()
    body = {"model": "charlm", "prompt": "JULIET:", "max_tokens": chars, "seed": seed, "stream": True}
    connection = http.client.HTTPConnection(server.host, server.port, timeout=120)
    started = time.perf_counter()
    connection.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    response = connection.getresponse()
    if response.status != 200:
        raise SystemExit(f"HTTP {response.status}: {response.read().decode()}")
    received = b""
    while b"data: [DONE]" not in received[-64:]:
        piece = response.read1(65536)
        if not piece:
            break
        if math.isnan(seen.first_char_s) and b'"text": "' in piece.replace(b'"text": ""', b""):  # a non-empty text
            seen.first_char_s = time.perf_counter() - started
        received += piece
    seen.total_s = time.perf_counter() - started
    connection.close()
    for line in received.decode().splitlines():
        data = line.removeprefix("data:").strip()
        if not line.startswith("data:") or not data:
            continue
        if data == "[DONE]":
            seen.done = True
            break
        choice = json.loads(data)["choices"][0]
        seen.chars += len(choice["text"])
        seen.finish_reason = choice.get("finish_reason") or seen.finish_reason
    return seen


def together(server: Server, clients: int, chars: int, seed: int) -> tuple[list[Stream], float]:
    """`clients` streams started at once; what each saw and the wall seconds until the last one ended."""
    results: list[Stream] = [Stream()] * clients
    barrier = threading.Barrier(clients + 1)

    def client(i: int) -> None:
        barrier.wait()
        results[i] = stream(server, chars, seed + i)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    barrier.wait()
    started = time.perf_counter()
    for t in threads:
        t.join()
    return results, time.perf_counter() - started


def complete(results: list[Stream], chars: int) -> bool:
    return all(r.done and r.chars == chars and r.finish_reason == "length" for r in results)


def against(args: argparse.Namespace) -> None:
    """This code's server and --against's side by side, rounds alternating: one client, then --clients together."""
    from bench_sample import checkout

    with tempfile.TemporaryDirectory() as tmp:
        sides = {
            "this code": Server(args.checkpoint),
            args.against: Server(args.checkpoint, checkout(args.against, Path(tmp))),
        }
        rates: dict[str, tuple[list[float], list[float]]] = {name: ([], []) for name in sides}
        try:
            for server in sides.values():
                stream(server, 20, 0)  # warm-up
            for round_ in range(1, args.rounds + 1):
                for name, server in sides.items():
                    alone = stream(server, args.chars, round_)
                    results, wall = together(server, args.clients, args.chars, 100 * round_)
                    if not (complete(results, args.chars) and alone.chars == args.chars):
                        raise SystemExit(f"{name}: a stream came back short")
                    rates[name][0].append(alone.chars / alone.total_s)
                    rates[name][1].append(sum(r.chars for r in results) / wall)
                    print(
                        f"round {round_}: {name:>12}: one client {rates[name][0][-1]:.0f} chars/s, {args.clients} "
                        f"clients {rates[name][1][-1]:.0f} chars/s",
                        flush=True,
                    )
        finally:
            for server in sides.values():
                server.stop()
    for name, (single, aggregate) in rates.items():
        one, many = statistics.median(single), statistics.median(aggregate)
        shown = f"{name:>12}: median one client {one:.0f} chars/s, {args.clients} clients {many:.0f} chars/s"
        print(f"{shown} ({many / one:.2f}x one)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", nargs="?", default="runs/cpu")
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--chars", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds of one client, then all of them")
    parser.add_argument("--first-char-trials", type=int, default=21)
    parser.add_argument("--record", action="store_true", help="append the figures to docs/benchmarks.md")
    parser.add_argument("--against", help="also serve with this commit's code, rounds alternating (one client, then N)")
    args = parser.parse_args()
    if not Path(args.checkpoint).exists():
        raise SystemExit(f"no model at {args.checkpoint}: train one with `charlm train` (or name a checkpoint)")
    if args.against:
        return against(args)

    server = Server(args.checkpoint)
    failures: list[str] = []
    rows: list[list[str]] = []
    try:
        stream(server, 20, 0)  # warm-up: the first request pays for lazy initialisation
        single_rates, aggregate_rates = [], []
        for round_ in range(1, args.rounds + 1):
            alone = stream(server, args.chars, round_)
            single_rates.append(alone.chars / alone.total_s)
            results, wall = together(server, args.clients, args.chars, 100 * round_)
            delivered = sum(r.chars for r in results)
            aggregate_rates.append(delivered / wall)
            p50_first = statistics.median(r.first_char_s for r in results) * 1000
            ratio = aggregate_rates[-1] / single_rates[-1]
            ok = complete(results, args.chars) and alone.chars == args.chars
            print(
                f"round {round_}: one client {single_rates[-1]:.0f} chars/s; {args.clients} clients {delivered} of "
                f"{args.clients * args.chars} chars in {wall:.2f} s = {aggregate_rates[-1]:.0f} chars/s "
                f"({ratio:.2f}x one), their p50 first char {p50_first:.0f} ms, all complete: {ok}",
                flush=True,
            )
            rows.append(
                [
                    str(round_),
                    f"{single_rates[-1]:.0f}",
                    f"{aggregate_rates[-1]:.0f}",
                    f"{ratio:.2f}x",
                    f"{p50_first:.0f}",
                    "yes" if ok else "NO",
                ]
            )
            if not ok:
                failures.append(f"round {round_}: a stream came back short")

        firsts = [stream(server, args.chars, 1000 + i).first_char_s * 1000 for i in range(args.first_char_trials)]
        p50 = statistics.median(firsts)
        print(
            f"one client, {args.first_char_trials} requests: time to first character p50 {p50:.1f} ms, "
            f"max {max(firsts):.1f} ms",
            flush=True,
        )

        killed = subprocess.Popen(
            [sys.executable, "-c", KILLED_CLIENT, server.host, str(server.port)],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert killed.stdout is not None
        killed.stdout.readline()  # it is streaming
        os.kill(killed.pid, signal.SIGKILL)
        killed.wait()
        results, wall = together(server, args.clients, args.chars, 5000)
        after_kill_ok = complete(results, args.chars)
        deadline = time.monotonic() + 10
        while (load := server.health())["running"] and time.monotonic() < deadline:
            time.sleep(0.05)
        print(
            f"a client killed with SIGKILL mid-stream, then {args.clients} clients: all complete: {after_kill_ok} "
            f"({wall:.2f} s); afterwards the server has {load['running']} running, {load['queued']} queued",
            flush=True,
        )
        if not after_kill_ok or load["running"] or load["queued"]:
            failures.append("after the killed client, a stream came back short or something stayed running")
    finally:
        server.stop()

    single, aggregate = statistics.median(single_rates), statistics.median(aggregate_rates)
    print(
        f"median: one client {single:.0f} chars/s, {args.clients} clients {aggregate:.0f} chars/s "
        f"({aggregate / single:.2f}x); p50 time to first character {p50:.1f} ms"
    )
    if args.record:
        rows.append(["first character, one client", "", "", "", f"p50 {p50:.1f} (max {max(firsts):.1f})", ""])
        rows.append(
            [
                "SIGKILLed client, then more",
                "",
                "",
                "",
                "",
                f"{'yes' if after_kill_ok else 'NO'} ({load['running']} left running)",
            ]
        )
        header = [
            "round",
            "one client (chars/s)",
            f"{args.clients} clients (chars/s, all)",
            "ratio",
            "p50 first char (ms)",
            "every char delivered",
        ]
        title = f"charlm serve under load: {args.clients} streaming clients x {args.chars} characters"
        append_section(title, header, rows)
    if failures:
        raise SystemExit("; ".join(failures))


if __name__ == "__main__":
    main()
