"""The settings that must agree with model.arch, checked with the rest of the config (no torch imported here)."""

from __future__ import annotations

from typing import Any


def arch_problems(model: Any, data: Any) -> list[str]:
    """Every setting that does not fit the model family, each naming its key and the fix."""
    arch, errors = model.arch, []
    a_arch = f"an {arch}" if arch.startswith("encoder") else f"a {arch}"
    if arch != "encoder-decoder":
        if data.format == "pairs":
            errors.append(f"data.format pairs needs model.arch encoder-decoder (not {arch})")
        only_encoder_decoder = {
            "model.n_encoder_layer": model.n_encoder_layer != 0,
            "model.share_embeddings": not model.share_embeddings,
            "model.cross_attention": not model.cross_attention,
        }
        errors += [
            f"{key} is for model.arch encoder-decoder; leave it at its default for {a_arch}"
            for key, changed in only_encoder_decoder.items()
            if changed
        ]
    if arch == "decoder":
        return errors
    if model.n_experts:
        errors.append(
            f"model.n_experts: mixtures of experts are decoder-only; {a_arch} has dense feed-forwards (set 0)"
        )
    if data.tokenizer != "char":
        errors.append(f"data.tokenizer byte: {a_arch} reads characters (leave data.tokenizer at char)")
    if arch == "encoder-decoder" and data.format != "pairs":
        errors.append("model.arch encoder-decoder trains on source<TAB>target lines: set data.format=pairs")
    return errors
