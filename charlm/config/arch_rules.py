"""The settings that must agree with model.arch, checked with the rest of the config (no torch imported here): one
rule per model family, looked up by name."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def _named(arch: str) -> str:
    return f"an {arch}" if arch.startswith("encoder") else f"a {arch}"


def _no_encoder_decoder_keys(model: Any, data: Any) -> list[str]:
    """What only an encoder-decoder takes: pairs, a separate encoder depth, shared embeddings, cross-attention."""
    errors = (
        [f"data.format pairs needs model.arch encoder-decoder (not {model.arch})"] if data.format == "pairs" else []
    )
    only_encoder_decoder = {
        "model.n_encoder_layer": model.n_encoder_layer != 0,
        "model.share_embeddings": not model.share_embeddings,
        "model.cross_attention": not model.cross_attention,
    }
    errors += [
        f"{key} is for model.arch encoder-decoder; leave it at its default for {_named(model.arch)}"
        for key, changed in only_encoder_decoder.items()
        if changed
    ]
    return errors


def _dense_characters(model: Any, data: Any) -> list[str]:
    """What only a decoder takes: a mixture of experts, bytes."""
    errors = []
    if model.n_experts:
        errors.append(
            f"model.n_experts: mixtures of experts are decoder-only; {_named(model.arch)} has dense feed-forwards "
            "(set 0)"
        )
    if data.tokenizer != "char":
        errors.append(f"data.tokenizer byte: {_named(model.arch)} reads characters (leave data.tokenizer at char)")
    return errors


def _pairs(model: Any, data: Any) -> list[str]:
    if data.format != "pairs":
        return ["model.arch encoder-decoder trains on source<TAB>target lines: set data.format=pairs"]
    return []


def _lines_of_characters(model: Any, data: Any) -> list[str]:
    """A decoder's item lists are over characters (the padding, start and end symbols are characters' ids)."""
    if data.format == "lines" and data.tokenizer != "char":
        return ["data.format lines reads characters: leave data.tokenizer at char"]
    return []


def _no_lines(model: Any, data: Any) -> list[str]:
    if data.format == "lines":
        return [f"data.format lines is for model.arch decoder, which makes whole items; {_named(model.arch)} does not"]
    return []


RULES: dict[str, Callable[[Any, Any], list[str]]] = {
    "decoder": lambda model, data: _no_encoder_decoder_keys(model, data) + _lines_of_characters(model, data),
    "encoder": lambda model, data: (
        _no_encoder_decoder_keys(model, data) + _dense_characters(model, data) + _no_lines(model, data)
    ),
    "encoder-decoder": lambda model, data: _dense_characters(model, data) + _pairs(model, data),
}


def arch_problems(model: Any, data: Any) -> list[str]:
    """Every setting that does not fit the model family, each naming its key and the fix (none for an unknown
    model.arch, which the config's own check of the key reports)."""
    rule = RULES.get(model.arch)
    return rule(model, data) if rule else []
