"""The encoder family (model.arch: encoder): BERT's masked-character objective at character level, scored by how
well hidden characters are restored, used to fill blanks in a text."""

from __future__ import annotations

from collections.abc import Callable
from numbers import Integral
from pathlib import Path
from typing import Any

import torch
from torch import nn

from charlm.config.schema import Config, ModelConfig
from charlm.data.corpus import Corpus, for_file, same_path, split_file
from charlm.data.masking import MaskedWindows
from charlm.data.tokenizer import Tokenizer
from charlm.decoding.fill import predict_blanks
from charlm.decoding.options import MAX_FILL_CANDIDATES
from charlm.decoding.steps import GraphRuntime, RuntimeCheck
from charlm.errors import UsageError
from charlm.evaluation.loss import EvalResult
from charlm.evaluation.masked import MaskedResult, all_windows, masked_score
from charlm.families.base import (
    DATA,
    FOLDER,
    CardFacts,
    Family,
    InlineExample,
    Loaded,
    Quality,
    data_name,
    parameters_row,
    shape_row,
    text_corpus,
    training_row,
)
from charlm.families.decoder import validation_ids
from charlm.families.losses import WindowLosses
from charlm.hardware.distributed import Dist
from charlm.models.encoder import Encoder
from charlm.models.info import ModelInfo, encoder_info
from charlm.models.onnx_graphs import Graph, encoder_graphs


class EncoderFamily(Family):
    name = "encoder"
    noun = "an encoder"
    does = "it restores hidden characters: charlm fill {ckpt} --prompt 'ROM_O' (fill() in Python)"
    module_type = Encoder
    scored_by = "an encoder is scored on hidden characters: use evaluate_masked() (charlm eval does)"

    def corpus(
        self, config: Config, tokenizer: Tokenizer | None, say: Callable[[str], None], hint: str | None
    ) -> Corpus:
        return text_corpus(config, tokenizer, say, hint)

    def batches(self, config: Config, corpus: Corpus, device: torch.device, seed: int) -> MaskedWindows:
        T, V = config.model.block_size, corpus.tokenizer.vocab_size
        return MaskedWindows(corpus.train, T, config.train.batch_size, device, seed, V)

    def periodic_losses(
        self, config: Config, corpus: Corpus, device: torch.device, amp: torch.dtype | None, dist: Dist
    ) -> WindowLosses:
        def score(model: nn.Module, ids: torch.Tensor, starts: torch.Tensor, device: torch.device, amp: Any) -> Any:
            total, _, count = masked_score(self.own(model), ids, starts, device, amp_dtype=amp)
            return total, count  # the loss of restoring hidden characters, hidden alike each time

        return WindowLosses(config, corpus, device, amp, dist, score)

    def final_pass(
        self, model: Encoder, corpus: Corpus, config: Config, device: torch.device, amp: torch.dtype | None
    ) -> tuple[EvalResult, bool]:
        val, whole = validation_ids(corpus, config)  # every whole window, its characters hidden alike
        total, _, count = masked_score(model, val, all_windows(val, config.model.block_size), device)
        return EvalResult(total / max(count, 1), count, "val", config.data.path), whole

    def info(self, config: ModelConfig, vocab_size: int) -> ModelInfo:
        return encoder_info(config, vocab_size)

    def as_encoder(self, loaded: Loaded) -> Encoder:
        return loaded.module

    def attention_module(self, loaded: Loaded) -> Encoder:
        return self.as_encoder(loaded)  # full attention: every character sees every other

    def onnx_graphs(self, module: Encoder) -> list[Graph]:
        return encoder_graphs(module)

    def onnx_check(self, loaded: Loaded, runtime: GraphRuntime) -> RuntimeCheck:
        from charlm.families.onnx_checks import encoder_check

        return encoder_check(loaded, self.as_encoder(loaded), runtime)

    def score(self, loaded: Loaded, data: str | None, split: str | None, options: dict[str, Any]) -> MaskedResult:
        if options.get("stride") is not None or options.get("beam", 1) != 1:
            raise UsageError("--stride and --beam are not for an encoder: it is scored on hidden characters")
        return evaluate_masked(loaded, data, split)

    def card_facts(self, loaded: Loaded, steps: int) -> CardFacts:
        try:
            scores: dict[str, Any] | None = evaluate_masked(loaded).to_dict()
        except UsageError:  # the training corpus is not here: the card says so
            scores = None
        try:
            example = fill_blanks(loaded, CARD_PROMPT)["text"]
        except UsageError:  # characters it has never seen, or a context shorter than the example
            example = ""
        return encoder_facts(loaded, steps, scores, example)


def fill_blanks(loaded: Loaded, text: str, mask_char: str = "_", top: int = 5) -> dict[str, Any]:
    """charlm.Model.fill: every blank of a text predicted at once from the rest, with its top candidates."""
    module = loaded.family.as_encoder(loaded)
    if not isinstance(mask_char, str) or len(mask_char) != 1:
        raise UsageError(f"the mask character must be one character, got {mask_char!r}")
    if isinstance(top, bool) or not isinstance(top, Integral) or not 1 <= top <= MAX_FILL_CANDIDATES:
        raise UsageError(
            f"top (candidates per blank) must be a whole number from 1 to {MAX_FILL_CANDIDATES}, got {top!r}"
        )
    blanks = [i for i, c in enumerate(text) if c == mask_char]
    if not blanks:
        raise UsageError(f"the text has no {mask_char!r} to fill: mark each hidden character with it")
    block_size, tokenizer = loaded.config.model.block_size, loaded.tokenizer
    if len(text) > block_size:
        raise UsageError(
            f"the text has {len(text)} characters but the model's context is {block_size}: give at most "
            f"{block_size} characters at a time"
        )
    known = "".join(tokenizer.decode([0]) if c == mask_char else c for c in text)  # a placeholder id
    unseen = tokenizer.unknown_chars(known)
    if unseen:
        shown = ", ".join(repr(c) for c in unseen[:10])
        raise UsageError(f"the text has characters the model has never seen: {shown}; leave them out")
    guesses = predict_blanks(module, loaded.encode_prompt(known), blanks, top)
    filled = list(text)
    for position, candidates in zip(blanks, guesses, strict=True):
        filled[position] = tokenizer.decode([candidates[0][0]])
    return {
        "text": "".join(filled),
        "blanks": [
            {"position": p, "candidates": [[tokenizer.decode([i]), round(prob, 6)] for i, prob in cands]}
            for p, cands in zip(blanks, guesses, strict=True)
        ],
    }


def evaluate_masked(loaded: Loaded, path: str | Path | None = None, split: str | None = None) -> MaskedResult:
    """charlm.Model.evaluate_masked: 15% of each window hidden as in training (the same positions every time), the
    loss and the share restored exactly."""
    module = loaded.family.as_encoder(loaded)
    own = loaded.config.data.path
    given = str(path) if path is not None else own
    split = split or ("val" if same_path(given, own) else "all")
    data = for_file(loaded.config.data, given, split)
    corpus = Corpus.from_config(data, loaded.tokenizer)
    ids = corpus.split(split)
    block_size = loaded.config.model.block_size
    starts = all_windows(ids, block_size)
    if not len(starts):
        raise UsageError(f"the {split} split of {given} is shorter than one window ({block_size})")
    with loaded.scoring_kernels():
        total, right, count = masked_score(module, ids, starts, loaded.device)
    return MaskedResult(total / count, right / count, count, split, split_file(data, split))


CARD_PROMPT = "ROM_O AND JUL_ET"  # the text with blanks an encoder's card fills


def encoder_facts(loaded: Loaded, steps: int, scores: dict[str, Any] | None, example: str) -> CardFacts:
    """An encoder's card: its shape, how well it restores hidden characters, and a filled example."""
    m = loaded.config.model
    quality = (
        Quality(
            f"validation split of {DATA}: ",
            f"{100 * scores['accuracy']:.2f}% of hidden characters restored",
            f" (15% of each window hidden), loss {scores['loss']:.4f} nats per hidden character",
        )
        if scores
        else None
    )
    return CardFacts(
        title="character-level encoder",
        data=data_name(loaded.config),
        summary=(
            "An encoder-only Transformer (BERT's masked-character objective) over "
            f"{loaded.tokenizer.vocab_size} characters and a\nmask symbol, trained with charlm on {DATA}."
        ),
        rows=(
            shape_row(m),
            training_row(loaded.config.train, steps),
            parameters_row(loaded),
        ),
        quality=quality,
        data_missing=f"the training corpus {DATA} was",
        commands=(
            f'charlm fill {FOLDER} --prompt "{CARD_PROMPT}"     # every _ filled at once, with the top candidates',
        ),
        python=(f'print(charlm.load({FOLDER}).fill("{CARD_PROMPT}")["text"])',),
        inline_example=InlineExample(CARD_PROMPT, "is filled as", example) if example else None,
    )
