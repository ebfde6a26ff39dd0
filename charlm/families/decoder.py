"""The decoder family (model.arch: decoder): a GPT trained on random windows of a text to predict each next
character, scored in nats per character, used to continue text."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from charlm.config.schema import Config, ModelConfig
from charlm.data.corpus import Corpus, RandomWindows, encode_compact, for_file, same_path, split_file
from charlm.data.tokenizer import Tokenizer, UnknownPolicy
from charlm.decoding.steps import GraphRuntime, RuntimeCheck
from charlm.errors import UsageError
from charlm.evaluation.loss import EvalResult, full_pass, windows_total
from charlm.families.base import (
    DATA,
    FOLDER,
    CardFacts,
    Family,
    Loaded,
    Quality,
    data_name,
    parameters_row,
    shape_row,
    text_corpus,
    training_row,
)
from charlm.families.losses import WindowLosses
from charlm.hardware.distributed import Dist
from charlm.models.decoder import Decoder
from charlm.models.info import ModelInfo, decoder_info
from charlm.models.onnx_graphs import Graph, decoder_graphs


class DecoderFamily(Family[Corpus, Decoder]):
    name = "decoder"
    noun = "a decoder"
    does = "it continues text: charlm sample {ckpt} --prompt TEXT (generate() in Python)"
    module_type = Decoder
    continues_text = True

    def corpus(
        self, config: Config, tokenizer: Tokenizer | None, say: Callable[[str], None], hint: str | None
    ) -> Corpus:
        return text_corpus(config, tokenizer, say, hint)

    def batches(self, config: Config, corpus: Corpus, device: torch.device, seed: int) -> RandomWindows:
        tc = config.train
        return RandomWindows(corpus.train, config.model.block_size, tc.batch_size, device, seed)

    def periodic_losses(
        self, config: Config, corpus: Corpus, device: torch.device, amp: torch.dtype | None, dist: Dist
    ) -> WindowLosses:
        T = config.model.block_size

        def score(model: nn.Module, ids: torch.Tensor, starts: torch.Tensor, device: torch.device, amp: Any) -> Any:
            return windows_total(model, ids, starts, T, device, amp_dtype=amp)

        return WindowLosses(config, corpus, device, amp, dist, score)

    def final_pass(
        self, model: Decoder, corpus: Corpus, config: Config, device: torch.device, amp: torch.dtype | None
    ) -> tuple[EvalResult, bool]:
        val, whole = validation_ids(corpus, config)
        return full_pass(model, val, config.model.block_size, device, amp_dtype=amp), whole

    def info(self, config: ModelConfig, vocab_size: int) -> ModelInfo:
        return decoder_info(config, vocab_size)

    def as_decoder(self, loaded: Loaded) -> Decoder:
        return loaded.module

    def attention_module(self, loaded: Loaded) -> Decoder:
        return self.as_decoder(loaded)

    def onnx_graphs(self, module: Decoder) -> list[Graph]:
        return decoder_graphs(module)

    def onnx_check(self, loaded: Loaded, runtime: GraphRuntime) -> RuntimeCheck:
        from charlm.families.onnx_checks import decoder_check

        return decoder_check(loaded, self.as_decoder(loaded), runtime)

    def score(self, loaded: Loaded, data: str | None, split: str | None, options: dict[str, Any]) -> EvalResult:
        if options.get("beam", 1) != 1:
            raise UsageError("--beam is for encoder-decoder models")
        path = Path(data) if data else None
        keys = ("unknown", "replace_with", "batch_size", "stride")
        return evaluate_text(loaded, path, split, **{k: options[k] for k in keys if k in options})

    def card_facts(self, loaded: Loaded, steps: int) -> CardFacts:
        try:
            scores: dict[str, Any] | None = evaluate_text(loaded).to_dict()
        except UsageError:  # the training corpus is not here: the card says so
            scores = None
        from charlm.decoding.generate import sample
        from charlm.decoding.options import DecodeOptions

        options = DecodeOptions.from_config(loaded.config.sample, max_new_tokens=300, seed=1)
        text = sample(self.as_decoder(loaded), loaded.tokenizer, loaded.encode_prompt("\n"), options).samples[0]
        return decoder_facts(loaded, steps, scores, text.strip("\n"))


def validation_ids(corpus: Corpus, config: Config) -> tuple[torch.Tensor, bool]:
    """The validation split, cut to train.final_eval_tokens on big corpora, and whether it is whole."""
    limit = config.train.final_eval_tokens
    val = corpus.val[: limit + 1] if limit else corpus.val
    return val, len(val) == len(corpus.val)


def evaluate_text(
    loaded: Loaded,
    text_or_path: str | Path | None = None,
    split: str | None = None,
    unknown: UnknownPolicy = "error",
    replace_with: str | None = None,
    batch_size: int = 64,
    stride: int | None = None,
) -> EvalResult:
    """charlm.Model.evaluate: a decoder's loss on a file or a text in one deterministic pass."""
    if loaded.family.scored_by:
        raise UsageError(loaded.family.scored_by)
    module, tokenizer, data = loaded.family.as_decoder(loaded), loaded.tokenizer, loaded.config.data
    own = data.path
    if text_or_path is None or names_a_file(text_or_path):
        path = str(text_or_path if text_or_path is not None else own)
        split = split or ("val" if same_path(path, own) else "all")
        data = for_file(data, path, split)
        corpus = Corpus.from_config(data, tokenizer, unknown, replacement=replace_with)
    else:
        split = split or "all"
        ids = encode_compact(tokenizer.encode(str(text_or_path), unknown, replace_with), tokenizer.vocab_size)
        corpus = (
            Corpus.from_ids(ids, tokenizer, for_file(data, "<text>"), "<text>")  # the fractions, no given files
            if split != "all"
            else Corpus(tokenizer, ids, ids[:0], ids[:0], "<text>", ids)
        )
    if split not in ("train", "val", "test", "all"):
        raise UsageError(f"split must be train, val, test or all, got {split!r}")
    ids = corpus.split(split)
    if len(ids) < 2:
        raise UsageError(f"the {split} split of {corpus.source} has fewer than 2 tokens to score")
    block_size = loaded.config.model.block_size
    if stride is not None and not 1 <= stride <= block_size:
        raise UsageError(f"--stride must be between 1 and the model's context ({block_size}), got {stride}")
    with loaded.scoring_kernels():
        result = full_pass(module, ids, block_size, loaded.device, batch_size, stride=stride)
    scored = split_file(data, split) if corpus.source != "<text>" else corpus.source
    result.split, result.file, result.unit = split, scored, tokenizer.unit
    return result


def names_a_file(value: str | Path) -> bool:
    return isinstance(value, Path) or (value != "" and "\n" not in value and len(value) < 4096 and Path(value).exists())


def decoder_facts(loaded: Loaded, steps: int, scores: dict[str, float] | None, sample: str) -> CardFacts:
    """A decoder's card: its shape and parts, its validation loss, and a sample."""
    m, unit = loaded.config.model, loaded.tokenizer.unit
    vocab, symbols = loaded.tokenizer.vocab_size, "bytes" if unit == "byte" else "characters"
    quality = (
        Quality(
            "validation pass: ",
            f"{scores['loss']:.4f} nats/{unit}, {scores['bpc']:.4f} bits/{unit}",
            f" (perplexity {scores['perplexity']:.3f}) on the validation split of {DATA}",
        )
        if scores
        else None
    )
    parts = (  # one table row: a line break inside it would end the table in Markdown
        f"{m.pos_encoding} positions, {m.norm} ({m.norm_position}), {m.activation} feed-forward x{m.ffn_mult:g}, "
        f"{'tied' if m.tie_weights else 'untied'} head"
    )
    return CardFacts(
        title="character-level language model",
        data=data_name(loaded.config),
        summary=f"A decoder-only Transformer over {vocab} {symbols}, trained with charlm on {DATA}.",
        rows=(
            shape_row(m),
            ("parts", parts),
            parameters_row(loaded),
            training_row(loaded.config.train, steps),
        ),
        quality=quality,
        data_missing=f"the training corpus {DATA} was",
        commands=(
            f'charlm sample {FOLDER} --prompt "JULIET:" --seed 1',
            f"charlm eval {FOLDER} --data input.txt",
        ),
        python=(
            f"model = charlm.load({FOLDER})",
            'print(model.generate("JULIET:", max_new_tokens=200, seed=1))',
        ),
        example_heading=f"A sample (seed 1, temperature {loaded.config.sample.temperature:g})",
        example=sample,
    )
