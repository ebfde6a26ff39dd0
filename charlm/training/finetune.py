"""Fine-tuning: a new run whose model starts from another model's weights (a checkpoint, run folder or export), with
its shape and vocabulary; optionally the vocabulary extended by the new text's characters.

Extending appends the new characters after the old ones (old ids keep their meaning) and gives each its own fresh
rows in the token embedding, the output head and the head's bias (if any), initialised as a new model's are; every
other weight is the source's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields, replace
from pathlib import Path
from typing import Any, cast

import torch

from charlm.config.build import raise_all
from charlm.config.checks import config_problems
from charlm.config.schema import Config, ModelConfig
from charlm.data.prepare import prepare
from charlm.data.tokenizer import CharTokenizer, Tokenizer
from charlm.errors import UsageError
from charlm.families.registry import family_for
from charlm.models.decoder import Decoder
from charlm.storage.checkpoint import Checkpoint
from charlm.storage.loading import load_model_file


def load_source(path: str | Path) -> Checkpoint:
    """The model to start from; a damaged or pickled file is refused like any checkpoint."""
    return load_model_file(path)


# What a fine-tuned run takes from its source (the weights' shape and how text becomes ids), and its dropout keys,
# which the command line may still set for it (regularisation for the new text).
SOURCE_KEYS = {f"model.{f.name}" for f in fields(ModelConfig)} | {"data.tokenizer"}
MODEL_KEYS = {"model.dropout", "model.attention_dropout"}


def finetune_config(requested: Config, source: Checkpoint, explicit: dict[str, Any] | None = None) -> Config:
    """The run's settings: model shape and tokenizer from the source, data and training from the command; of the
    command line's explicit settings (`explicit`), dropout is applied and anything else of the source's refused
    where it differs, never dropped in silence."""
    wanted, given = family_for(requested), family_for(source.config)
    if wanted.data_noun != "text":  # said before the source's keys meet the run's
        raise UsageError(f"--init-from starts from a text model; {wanted.noun} run starts fresh or resumes")
    if given.data_noun != "text":
        raise UsageError(f"--init-from starts from a text model; {source.path} is {given.noun}: train this run fresh")
    explicit = explicit or {}
    kept = source.config.flat()
    differ = [f"{k}={v!r} (it has {kept[k]!r})" for k, v in explicit.items() if k not in MODEL_KEYS and v != kept[k]]
    if differ:
        raise UsageError(
            f"--init-from keeps the shape and tokenizer of {source.path}: {', '.join(differ)}; leave them out (only "
            "model.dropout and model.attention_dropout can change), or train a new model without --init-from"
        )
    changed = {key.split(".", 1)[1]: explicit[key] for key in MODEL_KEYS & explicit.keys()}
    requested.model = replace(source.config.model, **changed)
    requested.data.tokenizer = source.config.data.tokenizer
    problems = config_problems(requested)  # the source's model beside the command's data and training
    raise_all([f"--init-from {source.path}: {problem}" for problem in problems])
    return requested


def finetune_tokenizer(
    source: Checkpoint, data_path: str, extend: bool, say: Callable[[str], None] = lambda _: None
) -> Tokenizer:
    """The source's vocabulary, or with `extend` that vocabulary plus the new text's characters it lacks."""
    tokenizer = source.tokenizer
    if not extend or not isinstance(tokenizer, CharTokenizer):
        return tokenizer  # a byte model reads every text already
    prepared = prepare(data_path, "char", say)
    new = [c for i, c in enumerate(prepared.tokenizer.chars) if c not in tokenizer.stoi and prepared.counts.get(i)]
    if new:
        say(
            f"extending the vocabulary from {tokenizer.vocab_size} to {tokenizer.vocab_size + len(new)} characters: "
            + ", ".join(repr(c) for c in new[:20])
            + (" ..." if len(new) > 20 else "")
        )
    return CharTokenizer(tokenizer.chars + new)


def init_model(source: Checkpoint, config: Config, vocab_size: int, device: torch.device) -> Decoder:
    """A model of the source's shape holding its weights; rows for characters beyond its vocabulary stay as freshly
    initialised (call with the run's seed set, so they are reproducible)."""
    old_vocab = source.tokenizer.vocab_size
    if not (source_family := family_for(source.config)).continues_text:
        raise UsageError(f"--init-from needs a decoder (text) model; {source.path} is {source_family.noun}")
    if vocab_size == old_vocab:
        return cast(Decoder, source.build_model(device))
    model = Decoder(config.model, vocab_size)
    old = source.build_model("cpu").state_dict()
    fresh = model.state_dict()
    for name, weight in old.items():
        target = fresh[name]
        if target.shape == weight.shape:
            target.copy_(weight)
        elif target.shape[1:] == weight.shape[1:] and target.shape[0] == vocab_size and weight.shape[0] == old_vocab:
            target[:old_vocab].copy_(weight)  # embedding, head or head-bias rows of the characters both know
        else:
            raise UsageError(f"cannot extend {source.path}: its weight {name} has shape {tuple(weight.shape)}")
    model.load_state_dict(fresh)
    return model.to(device)
