"""What `charlm serve` accepts: its limits, and each request body checked field by field into one clear error.

The completions fields are OpenAI's (https://platform.openai.com/docs/api-reference/completions); `top_k` is
charlm's own. Fields OpenAI defines that charlm does not implement are accepted only at their neutral values, so a
request never silently means something else here than there.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from charlm.decoding.options import DecodeOptions, OptionError


@dataclass(frozen=True)
class Limits:
    """What one server takes; each exceeded limit is a 4xx naming it (and its flag)."""

    max_batch: int = 32  # completions decoded together (rows of the KV cache)
    max_queue: int = 256  # completions waiting for a row
    max_prompt: int = 8192  # characters in one prompt or scored text
    max_tokens: int = 4096  # characters one completion may ask for
    max_n: int = 16  # completions per request (prompts x n)
    max_body: int = 1_000_000  # bytes in a request body


class BadRequest(Exception):
    """A request the server refuses: HTTP status, one-line message, and the offending field (OpenAI's `param`)."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code


@dataclass(frozen=True)
class SamplingDefaults:
    """What a completions request gets for each decoding field it leaves out, and whose settings those are (the
    model's, as `charlm sample` decodes with no options, or OpenAI's); /v1/models lists them as request fields."""

    source: str  # "model" or "openai": --generation-defaults
    temperature: float
    top_k: int | None
    top_p: float
    max_tokens: int | None  # None: a target whole, to the model's end symbol (an encoder-decoder)
    stop: tuple[str, ...] = ()
    capped_from: int | None = None  # the model's max_new_tokens, when --max-tokens is lower

    def fields(self) -> dict[str, Any]:
        """The defaults as a completions body would spell them."""
        shown = ("temperature", "top_k", "top_p", "max_tokens")
        return {name: getattr(self, name) for name in shown} | {"stop": list(self.stop)}

    def sentence(self) -> str:
        """One line for the server's start-up message."""
        whose = "the model's sampling settings" if self.source == "model" else "OpenAI's defaults"
        greedy = " (greedy)" if self.temperature == 0 else ""
        parts = [f"temperature {self.temperature:g}{greedy}", f"top_k {self.top_k or 'none'}", f"top_p {self.top_p:g}"]
        tokens = "none (a target whole)" if self.max_tokens is None else str(self.max_tokens)
        if self.capped_from is not None:
            tokens += f" (the model's {self.capped_from}, capped by --max-tokens)"
        parts += [f"max_tokens {tokens}", f"stop {list(self.stop)}" if self.stop else "no stop"]
        return f"requests that leave temperature, top_k, top_p, max_tokens or stop out get {whose}: {', '.join(parts)}"


OPENAI_DEFAULTS = SamplingDefaults("openai", temperature=1.0, top_k=None, top_p=1.0, max_tokens=16)
# an encoder-decoder's own: `charlm sample` and Model.transduce, given no options, decode the most likely target whole
TARGET_DEFAULTS = SamplingDefaults("model", temperature=0.0, top_k=None, top_p=1.0, max_tokens=None)


def model_defaults(options: DecodeOptions, limits: Limits) -> SamplingDefaults:
    """A decoder's own sampling settings (DecodeOptions.from_config of its checkpoint, as `charlm sample` takes them),
    max_tokens held within the server's --max-tokens."""
    tokens = max(1, min(options.max_new_tokens, limits.max_tokens))  # a request asks for one character at least
    capped = options.max_new_tokens if tokens < options.max_new_tokens else None
    kept = (options.temperature, options.top_k, options.top_p, tokens, tuple(options.stop), capped)
    return SamplingDefaults("model", *kept)


@dataclass
class CompletionRequest:
    model: str | None  # None: the one model this server holds
    prompts: list[str]
    options: DecodeOptions  # each choice's; choice j of a prompt is seeded with seed + j
    n: int
    stream: bool
    logprobs: int | None
    include_usage: bool


# OpenAI fields charlm does not implement: the JSON type OpenAI gives each, and the value at which it changes nothing.
# The type is checked first: Python's True == 1 and False == 0, so `"best_of": true` would pass for 1 by value alone.
NEUTRAL: dict[str, tuple[Any, str]] = {
    "echo": (False, "boolean"),
    "best_of": (1, "integer"),
    "frequency_penalty": (0, "number"),
    "presence_penalty": (0, "number"),
    "suffix": (None, "string"),
    "logit_bias": ({}, "object"),
}
KNOWN = {"model", "prompt", "max_tokens", "temperature", "top_p", "top_k", "n", "stop", "seed", "stream"}
KNOWN |= {"logprobs", "stream_options", "user", *NEUTRAL}
SEED_MAX = 2**63 - 1  # choice j of a prompt is seeded with seed + j, and a seed is a 64-bit integer


def json_type(value: Any) -> str:
    """The JSON type of a parsed value, as OpenAI's reference names them (a bool is never a number here)."""
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    kinds = {float: "number", str: "string", list: "array", dict: "object"}
    return next((name for kind, name in kinds.items() if isinstance(value, kind)), "null")


def is_a(value: Any, kind: str) -> bool:
    return json_type(value) == kind or (kind == "number" and json_type(value) == "integer")


def _number(body: dict, name: str, default: Any, low: float, high: float, whole: bool) -> Any:
    value = body.get(name, default)
    if value is None:
        return default
    ok = isinstance(value, int) if whole else isinstance(value, (int, float))
    if isinstance(value, bool) or not ok:
        kind = "a whole number" if whole else "a number"
        raise BadRequest(400, f"{name} must be {kind}, got {value!r}", name)
    if isinstance(value, float) and not math.isfinite(value):  # NaN and Infinity, which Python's json reads
        raise BadRequest(400, f"{name} must be a finite number, got {value}", name)
    if not low <= value <= high:  # the server's own limits (ranges every decoder shares: DecodeOptions.checked)
        raise BadRequest(400, f"{name} must be between {low} and {high}, got {value}", name)
    return value


def json_name(option: str) -> str:
    """How OpenAI's completions API names a decoding option."""
    return "max_tokens" if option == "max_new_tokens" else option


def parse_completion(
    body: Any, limits: Limits, default_prompt: str = "\n", defaults: SamplingDefaults = OPENAI_DEFAULTS
) -> CompletionRequest:
    """The completion a JSON body asks for, or BadRequest naming the first thing wrong with it (a body without a
    prompt continues `default_prompt`: a newline, or nothing for a lines model's whole items; a decoding field left
    out takes `defaults`' value, and max_tokens without one the server's limit)."""
    if not isinstance(body, dict):
        raise BadRequest(400, "the request body must be a JSON object")
    # the groups in the order a request is checked: its first fault is the one named
    check_field_names(body)
    model = model_field(body)
    prompts = prompts_field(body, limits, default_prompt)
    max_tokens, n = amount_fields(body, limits, defaults, len(prompts))
    stops = stop_field(body, defaults)
    stream, include_usage = stream_fields(body)
    decoding = decoding_fields(body, defaults, max_tokens, stops, n)
    return CompletionRequest(
        model=model,
        prompts=prompts,
        options=decoding,
        n=n,
        stream=stream,
        logprobs=_number(body, "logprobs", None, 0, 5, whole=True),
        include_usage=include_usage,
    )


def check_field_names(body: dict) -> None:
    """Refuse a field OpenAI's completions API does not have, one it has that charlm does not implement set to
    anything but its neutral value, and a `user` that is not a string."""
    unknown = sorted(set(body) - KNOWN)
    if unknown:
        raise BadRequest(400, f"unknown field {unknown[0]!r}; the fields are OpenAI's completions fields and top_k")
    for name, (neutral, kind) in NEUTRAL.items():
        value = body.get(name)
        if value is not None and not is_a(value, kind):
            raise BadRequest(400, f"{name} must be a JSON {kind}, got {json.dumps(value)}", name)
        if value is not None and value != neutral:
            shown = json.dumps(neutral)
            raise BadRequest(400, f"{name} is not supported by charlm serve (leave it out or at {shown})", name)
    if body.get("user") is not None and not isinstance(body["user"], str):  # OpenAI's end-user id: kept nowhere here
        raise BadRequest(400, f"user must be a string, got {json.dumps(body['user'])}", "user")


def prompts_field(body: dict, limits: Limits, default_prompt: str) -> list[str]:
    """A body's `prompt` as a list of prompts, each within --max-prompt."""
    prompt = body.get("prompt", default_prompt)
    prompts = [prompt] if isinstance(prompt, str) else prompt
    if not isinstance(prompts, list) or not prompts or not all(isinstance(p, str) for p in prompts):
        raise BadRequest(
            400, "prompt must be a string or a non-empty list of strings (token ids are not taken)", "prompt"
        )
    for p in prompts:
        if len(p) > limits.max_prompt:
            raise BadRequest(
                400,
                f"a prompt has {len(p)} characters; the limit is {limits.max_prompt} (--max-prompt)",
                "prompt",
                "prompt_too_long",
            )
    return prompts


def amount_fields(body: dict, limits: Limits, defaults: SamplingDefaults, prompt_count: int) -> tuple[int, int]:
    """How much a body asks for: `max_tokens` per completion and `n` completions per prompt, within the server's
    --max-tokens and --max-n."""
    default_tokens = limits.max_tokens if defaults.max_tokens is None else defaults.max_tokens
    max_tokens = _number(body, "max_tokens", default_tokens, 1, limits.max_tokens, whole=True)
    n = _number(body, "n", 1, 1, limits.max_n, whole=True)
    if n * prompt_count > limits.max_n:
        raise BadRequest(
            400,
            f"{prompt_count} prompts x n={n} is {n * prompt_count} completions; the limit is "
            f"{limits.max_n} per request (--max-n)",
            "n",
        )
    return max_tokens, n


def stop_field(body: dict, defaults: SamplingDefaults) -> list[str]:
    """A body's stop strings: one, a list of up to 4, or the defaults' when it leaves `stop` out."""
    stop = body.get("stop")
    stops = list(defaults.stop) if stop is None else [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or len(stops) > 4 or not all(isinstance(s, str) and s for s in stops):
        raise BadRequest(400, "stop must be a non-empty string or a list of at most 4 of them", "stop")
    return stops


def stream_fields(body: dict) -> tuple[bool, bool]:
    """Whether a body asks for a stream, and whether for the usage chunk at its end (`stream_options`)."""
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise BadRequest(400, f"stream must be true or false, got {stream!r}", "stream")
    options = body.get("stream_options")
    options = {} if options is None else options  # [], 0 and false are not an empty object: refused, not read as one
    known = isinstance(options, dict) and set(options) <= {"include_usage", "include_obfuscation"}  # OpenAI's two
    if not known or not all(isinstance(options.get(k, False), bool) for k in ("include_usage", "include_obfuscation")):
        shape = '{"include_usage": true|false} (include_obfuscation is taken and changes nothing)'
        raise BadRequest(400, f"stream_options must be {shape}, got {json.dumps(options)}", "stream_options")
    return stream, bool(options.get("include_usage", False))


def decoding_fields(body: dict, defaults: SamplingDefaults, max_tokens: int, stops: list[str], n: int) -> DecodeOptions:
    """Each choice's decoding options: a body's temperature, top_k, top_p and seed (the defaults' where it leaves
    them out) with the amount and stop strings already read, held to the rules every way of decoding follows."""
    decoding = DecodeOptions(
        max_new_tokens=max_tokens,
        temperature=_number(body, "temperature", defaults.temperature, -math.inf, math.inf, whole=False),
        top_k=_number(body, "top_k", defaults.top_k, -math.inf, math.inf, whole=True),
        top_p=_number(body, "top_p", defaults.top_p, -math.inf, math.inf, whole=False),
        seed=_number(body, "seed", None, -math.inf, math.inf, whole=True),
        stop=stops,
    )
    try:
        decoding.checked(json_name)  # the rule every other way of decoding follows
    except OptionError as e:
        raise BadRequest(400, str(e), json_name(e.option)) from None
    if decoding.seed is not None and decoding.seed + n - 1 > SEED_MAX:  # every family seeds choice j with seed + j
        raise BadRequest(
            400,
            f"seed + n - 1 must be at most 2**63 - 1 ({SEED_MAX}): choice j is drawn with seed + j, and seed "
            f"{decoding.seed} with n={n} passes it; lower the seed",
            "seed",
        )
    return decoding


def model_field(body: dict) -> str | None:
    """A body's `model`: optional, as in vLLM and llama.cpp (a server holds one model), else a non-empty string; that
    it names the served model is checked apart (http.served_name: 404, as OpenAI answers a model it does not have)."""
    model = body.get("model")
    if model is not None and (not isinstance(model, str) or not model):
        raise BadRequest(400, "model must be the name GET /v1/models lists, or left out for the served model", "model")
    return model


def parse_text(body: Any, limits: Limits, field: str = "text") -> str:
    """The text of a /v1/score or /v1/attention body."""
    if not isinstance(body, dict):
        raise BadRequest(400, "the request body must be a JSON object")
    unknown = sorted(set(body) - {field, "model"})
    if unknown:
        raise BadRequest(400, f"unknown field {unknown[0]!r}; this endpoint takes {field!r} (and model)")
    text = body.get(field)
    model_field(body)  # the same rule as /v1/completions' (the served name is checked after, as there)
    if not isinstance(text, str) or not text:
        raise BadRequest(400, f"{field} must be a non-empty string", field)
    if len(text) > limits.max_prompt:
        raise BadRequest(
            400,
            f"{field} has {len(text)} characters; the limit is {limits.max_prompt} (--max-prompt)",
            field,
            "prompt_too_long",
        )
    return text
