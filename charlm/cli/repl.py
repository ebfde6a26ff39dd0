"""`charlm sample --interactive`: load a model once, then continue prompt after prompt.

On a terminal: line editing and history (readline), each continuation streamed, /commands to change the sampling
options, Ctrl-C stops the current continuation, Ctrl-D leaves. Without a terminal: one prompt per input line, one
continuation per prompt on one output block, so scripts can drive it.
"""

from __future__ import annotations

import contextlib
import signal
import sys
from collections.abc import Iterator
from dataclasses import replace
from typing import Any, TextIO

from charlm.api.model import Model
from charlm.data.tokenizer import UnknownPolicy
from charlm.decoding.options import DecodeOptions, check_values
from charlm.errors import CharlmError, UsageError

HELP = """commands:
  /temperature T   softmax temperature (0 = greedy)
  /top-k K         keep the K most likely characters (/top-k off keeps all)
  /top-p P         nucleus sampling, 0 <= P <= 1 (0: the most likely character alone)
  /max N           characters to generate per prompt
  /seed S          fix the seed (/seed off: a new one each time)
  /help            this list, with the current settings
  /quit            leave (or Ctrl-D)
anything else is a prompt (start it with // to begin a prompt with /); Ctrl-C stops a continuation."""

# command name -> (DecodeOptions field, parser); "off" gives None where the field allows it
_COMMANDS = {
    "/temperature": ("temperature", float),
    "/top-k": ("top_k", int),
    "/top-p": ("top_p", float),
    "/max": ("max_new_tokens", int),
    "/seed": ("seed", int),
}
_NULLABLE = {"top_k", "seed"}


def settings_line(options: DecodeOptions) -> str:
    return (
        f"temperature {options.temperature}, top-k {options.top_k or 'off'}, top-p {options.top_p}, "
        f"max {options.max_new_tokens}, seed {'off' if options.seed is None else options.seed}"
    )


def apply_command(line: str, options: DecodeOptions) -> tuple[DecodeOptions, str]:
    """The options after a /command, and what to tell the user; a mistake raises UsageError with its fix."""
    name, _, value = line.strip().partition(" ")
    value = value.strip()
    if name in ("/help", "/?"):
        return options, HELP + "\nnow: " + settings_line(options)
    if name not in _COMMANDS:
        raise UsageError(f"unknown command {name!r}; /help lists the commands")
    field, parse = _COMMANDS[name]
    if not value:
        raise UsageError(f"{name} needs a value, e.g. {name} {'0.8' if parse is float else '20'}")
    parsed: Any = None  # "off" (None), or a float or an int, as the command's field takes
    if not (value == "off" and field in _NULLABLE):
        try:
            parsed = parse(value)
        except ValueError:
            kind = "a number" if parse is float else "a whole number"
            raise UsageError(f"{name} takes {kind}, got {value!r}") from None
        check_values({field: parsed}, lambda _: name)  # named as typed: /seed, not --seed
    options = replace(options, **{field: parsed})
    return options, "now: " + settings_line(options)


def _continue(
    model: Model, prompt: str, options: DecodeOptions, unknown: UnknownPolicy, replace_with: str | None, out: TextIO
) -> None:
    """Stream one continuation to `out`; Ctrl-C ends it early and keeps what was written."""

    def write(text: str) -> None:
        out.write(text)
        out.flush()

    ids = model.encode_prompt(prompt, unknown, replace_with)
    write(model.tokenizer.decode(ids))
    with _ctrl_c_recorded() as pressed:

        def stream(text: str) -> None:
            write(text)
            if pressed:  # Ctrl-C was pressed: stop here, in charlm's own frame (see _ctrl_c_recorded)
                raise KeyboardInterrupt

        try:
            model.sample(ids, options, on_text=stream)
        except KeyboardInterrupt:
            write("\n[stopped]")
    write("\n")


@contextlib.contextmanager
def _ctrl_c_recorded() -> Iterator[list[int]]:
    """SIGINT is recorded in the yielded list, and the streaming callback stops the continuation at the next
    character. The handler does not raise on the first press: a KeyboardInterrupt raised wherever the main thread
    happens to be (inside torch's Python code, a finaliser, a callback from C) can be printed and dropped, or leave
    a half-done step behind. A second press before the next character (a long compile) raises at once."""
    pressed: list[int] = []

    def handle(signum: int, frame: object) -> None:
        pressed.append(signum)
        if len(pressed) > 1:
            raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGINT, handle)
    except ValueError:  # not the main thread (a notebook's worker): leave signals alone
        yield pressed
        return
    try:
        yield pressed
    finally:
        signal.signal(signal.SIGINT, previous)


def run_repl(
    model: Model,
    options: DecodeOptions,
    unknown: UnknownPolicy = "error",
    replace_with: str | None = None,
    stdin: TextIO | None = None,
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> None:
    """Read prompts until /quit or end of input; a terminal gets line editing, a pipe one continuation per line."""
    stdin, out, err = stdin or sys.stdin, out or sys.stdout, err or sys.stderr
    interactive = stdin.isatty()
    options = replace(options, num_samples=1)
    if interactive:
        import readline  # noqa: F401  (importing it gives input() line editing and history)

        err.write(
            f"{model!r}\n{settings_line(options)}\nType a prompt and press Enter; /help lists the commands, "
            "Ctrl-D leaves.\n"
        )
        err.flush()
    while True:
        try:
            line = input("> ") if interactive else stdin.readline()
        except EOFError:
            break
        except KeyboardInterrupt:  # Ctrl-C at the prompt clears the line
            out.write("\n")
            continue
        if not interactive:
            if not line:
                break
            line = line.rstrip("\n")
        if not line.strip():
            if not model.family.makes_items:
                continue
            line = ""  # a lines model: Enter alone makes a whole item from nothing
        if line.startswith("/") and (line.split()[0] in ("/quit", "/exit")):
            break
        try:
            if line.startswith("/") and not line.startswith("//"):
                options, message = apply_command(line, options)
                err.write(message + "\n")
                err.flush()
            else:
                prompt = line[1:] if line.startswith("//") else line
                _continue(model, prompt, options, unknown, replace_with, out)
        except CharlmError as e:
            if not interactive:
                raise  # a script wants the error and the exit code, not a skipped line
            err.write(f"error: {e}\n")
            err.flush()
    if interactive:
        out.write("\n")
        out.flush()
