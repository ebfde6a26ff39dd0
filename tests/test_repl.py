"""`charlm sample --interactive`: from a pipe (one continuation per line) and under a real pseudo-terminal."""

from __future__ import annotations

import io
import os
import pty
import select
import signal
import sys
import termios
import time
from collections.abc import Callable

import pytest
from conftest import REPO, assert_one_line_error, run_cli


def test_pipe_gives_one_continuation_per_line_like_sample(tiny_checkpoint):
    single = run_cli(
        "sample",
        tiny_checkpoint,
        "--prompt",
        "JULIET:",
        "--temperature",
        "0",
        "--max-new-tokens",
        "20",
        "--no-stream",
        check=True,
    ).stdout
    result = run_cli(
        "sample",
        tiny_checkpoint,
        "--interactive",
        "--max-new-tokens",
        "20",
        input="/temperature 0\nJULIET:\n\nJULIET:\n/max 5\nROMEO:\n",
        check=True,
    )
    assert result.stdout.count(single) == 2  # greedy: both equal a one-shot `charlm sample`
    assert "now: temperature 0.0" in result.stderr
    last = result.stdout[result.stdout.rindex("ROMEO:") :]
    assert len(last) == len("ROMEO:") + 5 + 1  # five characters (greedy may give newlines), then the end of line


@pytest.mark.parametrize(
    "line, needle",
    [
        ("/temperature hot", "/temperature takes a number"),
        ("/temperature", "/temperature needs a value"),
        ("/bogus", "unknown command '/bogus'"),
        ("/top-k 0", "/top-k must be >= 1"),  # named as typed, not as the flag
        ("/seed 99999999999999999999", "/seed must be between"),
    ],
)
def test_pipe_mistake_is_one_line_and_exit_code(tiny_checkpoint, line, needle):
    result = run_cli("sample", tiny_checkpoint, "--interactive", input=line + "\n")
    assert_one_line_error(result, 2, needle)  # a user's mistake, as everywhere: exit 2


class CtrlCInAFinaliser(io.StringIO):
    """A terminal whose first write is followed by a Ctrl-C that arrives while a finaliser runs (as it can in any
    finaliser or callback from C that runs while a continuation streams): an exception raised there would be
    reported to sys.unraisablehook and dropped."""

    def write(self, text: str) -> int:
        written = super().write(text)
        if len(self.getvalue()) > 8 and not getattr(self, "pressed", False):
            self.pressed = True
            SendsCtrlCWhenCollected()  # collected at once: its finaliser runs here
        return written


class SendsCtrlCWhenCollected:
    def __del__(self) -> None:
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(1000):  # bytecode to run the Python-level handler on, inside the finaliser
            pass


def test_a_ctrl_c_during_a_finaliser_stops_the_continuation_at_the_next_character(tiny_checkpoint, monkeypatch):
    from charlm.api.entry import load
    from charlm.cli.repl import _continue
    from charlm.decoding.options import DecodeOptions

    dropped: list[type] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda unraisable: dropped.append(unraisable.exc_type))
    before = signal.getsignal(signal.SIGINT)
    out = CtrlCInAFinaliser()
    _continue(load(tiny_checkpoint), "JULIET:", DecodeOptions(max_new_tokens=100_000), "error", None, out)
    assert dropped == []  # nothing was raised inside the finaliser
    assert out.getvalue().endswith("\n[stopped]\n") and len(out.getvalue()) < 100  # the next character stopped it
    assert signal.getsignal(signal.SIGINT) is before  # the REPL's handler is gone once the continuation ends


def test_a_second_ctrl_c_raises_at_once():
    from charlm.cli.repl import _ctrl_c_recorded

    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt), _ctrl_c_recorded() as pressed:
        assert signal.getsignal(signal.SIGINT) is not before  # the REPL's handler, not Python's
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(1000):  # bytecode to run the handler on
            pass
        assert pressed == [signal.SIGINT]  # the first press is recorded, not raised
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(1_000_000):  # the second raises here
            pass
    assert pressed == [signal.SIGINT, signal.SIGINT] and signal.getsignal(signal.SIGINT) is before


def test_interactive_refuses_a_prompt_flag(tiny_checkpoint):
    result = run_cli("sample", tiny_checkpoint, "--interactive", "--prompt", "x")
    assert result.returncode == 2 and "--interactive" in result.stderr


class Terminal:
    """The REPL as a child process on a pseudo-terminal: what a person at a keyboard sees and types."""

    def __init__(self, *args: str):
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # child: the pty is its controlling terminal, so Ctrl-C becomes SIGINT
            # faulthandler: a REPL that hangs shows where, when the test sends SIGABRT (see _read_while)
            env = {**os.environ, "PYTHONPATH": str(REPO), "TERM": "dumb", "PYTHONFAULTHANDLER": "1"}
            os.execvpe(sys.executable, [sys.executable, "-m", "charlm", *args], env)
        # A terminal flushes its pending output when Ctrl-C raises SIGINT (unless NOFLSH), after sending the signal:
        # a REPL fast enough to print "[stopped]" and its prompt before that flush would have both discarded, and the
        # test would wait for text that was thrown away. Keep output, as `stty noflsh` does.
        attributes = termios.tcgetattr(self.fd)
        attributes[3] |= termios.NOFLSH
        termios.tcsetattr(self.fd, termios.TCSANOW, attributes)
        self.seen = ""

    def read_until(self, needle: str, timeout: float = 60) -> str:
        self._read_while(lambda: needle not in self.seen, repr(needle), timeout)
        found = self.seen[: self.seen.index(needle) + len(needle)]
        self.seen = self.seen[len(found) :]
        return found

    def read_chars(self, count: int, timeout: float = 60) -> str:
        """The next `count` characters shown (e.g. the first ones of a continuation being streamed)."""
        self._read_while(lambda: len(self.seen) < count, f"{count} characters", timeout)
        found, self.seen = self.seen[:count], self.seen[count:]
        return found

    def _read_while(self, waiting: Callable[[], bool], what: str, timeout: float) -> None:
        """Read what the terminal shows until `waiting()` is false; `timeout` only guards against a hung REPL."""
        deadline = time.monotonic() + timeout
        while waiting():
            left = deadline - time.monotonic()
            if left <= 0:
                shown = self.seen[-2000:]
                raise AssertionError(f"no {what} within {timeout} s; the terminal showed:\n{shown}{self._stacks()}")
            if select.select([self.fd], [], [], left)[0]:
                try:
                    chunk = os.read(self.fd, 4096)
                except OSError:  # the child closed the terminal
                    chunk = b""
                if not chunk:
                    raise AssertionError(f"the REPL ended before {what}:\n{self.seen[-2000:]}")
                self.seen += chunk.decode("utf-8", "replace")

    def _stacks(self) -> str:
        """What faulthandler prints when the hung REPL gets SIGABRT: every thread's stack."""
        os.kill(self.pid, signal.SIGABRT)
        printed, deadline = "", time.monotonic() + 5
        while time.monotonic() < deadline and select.select([self.fd], [], [], 0.5)[0]:
            try:
                chunk = os.read(self.fd, 4096)
            except OSError:
                break
            if not chunk:
                break
            printed += chunk.decode("utf-8", "replace")
        return f"\nthe REPL's stacks on SIGABRT:\n{printed[-6000:]}"

    def type(self, text: str) -> None:
        os.write(self.fd, text.encode())

    def wait(self, timeout: float = 30) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                return os.waitstatus_to_exitcode(status)
            try:
                if select.select([self.fd], [], [], 0.1)[0]:
                    os.read(self.fd, 4096)
            except OSError:
                time.sleep(0.1)
        os.kill(self.pid, 9)
        raise AssertionError("the REPL did not exit")


@pytest.mark.process
def test_terminal_prompt_temperature_ctrl_c_ctrl_d(tiny_checkpoint):
    term = Terminal("sample", str(tiny_checkpoint), "--interactive", "--max-new-tokens", "30")
    try:
        term.read_until("> ")
        term.type("/temperature 0.5\r")
        term.read_until("now: temperature 0.5")
        term.read_until("> ")
        term.type("JULIET:\r")
        shown = term.read_until("> ")
        assert "JULIET:" in shown and len(shown) > len("JULIET:") + 20  # a streamed continuation
        term.type("/max 10000000\r")
        term.read_until("> ")
        term.type("ROMEO:\r")
        term.read_until("ROMEO:")
        term.read_until("ROMEO:")  # the echo of the line, then the prompt as the model sees it
        term.read_chars(20)  # the continuation is streaming: ten million characters would take hours
        term.type("\x03")
        term.read_until("[stopped]")
        term.read_until("> ")
        term.type("/seed 3\r")  # still alive after Ctrl-C
        term.read_until("seed 3")
        term.read_until("> ")
        term.type("\x04")  # Ctrl-D on an empty line leaves
        assert term.wait() == 0
    finally:
        try:
            os.kill(term.pid, 9)
            os.waitpid(term.pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass
        os.close(term.fd)


@pytest.mark.process
def test_terminal_mistakes_keep_the_session(tiny_checkpoint):
    term = Terminal("sample", str(tiny_checkpoint), "--interactive")
    try:
        term.read_until("> ")
        for command, message in (("/top-p 2", "/top-p must be between 0 and 1"), ("/nope", "unknown command")):
            term.type(command + "\r")
            term.read_until(message)
            term.read_until("> ")
        term.type("/quit\r")
        assert term.wait() == 0
    finally:
        try:
            os.kill(term.pid, 9)
            os.waitpid(term.pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass
        os.close(term.fd)
