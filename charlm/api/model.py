"""charlm from Python: train a model, load one, generate text, score text, count parameters.

The commands use these same functions, so a notebook and the command line give the same figures and the same
`CharlmError` messages. Nothing here installs signal handlers or exits the process.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from charlm.api.model_arch import ArchMethods, _same_file
from charlm.config import schema as cfg
from charlm.config.schema import Config
from charlm.data.corpus import Corpus, encode_compact
from charlm.data.tokenizer import Tokenizer, UnknownPolicy
from charlm.decoding.generate import SampleResult, encode_prompt, sample
from charlm.decoding.options import DecodeOptions, field_name
from charlm.errors import UsageError
from charlm.evaluation.loss import EvalResult, full_pass
from charlm.hardware.device import pick_device
from charlm.models.decoder import GPT
from charlm.models.encoder import EncoderOnly
from charlm.models.encoder_decoder import EncoderDecoder
from charlm.models.info import ModelInfo, model_info
from charlm.models.quantize import for_decoding
from charlm.models.registry import AnyModel
from charlm.storage.checkpoint import Checkpoint
from charlm.storage.loading import load_model_file


class Model(ArchMethods):
    """A trained model ready to use: `generate` (a decoder) or `transduce` (an encoder-decoder), `evaluate`, `info`;
    `module` is the plain torch.nn.Module."""

    def __init__(self, module: AnyModel, tokenizer: Tokenizer, config: Config, path: Path):
        self.module, self.tokenizer, self.config, self.path = module, tokenizer, config, path

    def _wrong_arch(self, wanted: str) -> UsageError:
        """A one-line error: this model's arch cannot do `wanted`; what it does instead."""
        instead = {
            "decoder": "it continues text: use generate() (charlm sample CKPT --prompt TEXT)",
            "encoder-decoder": "it rewrites a source string: use transduce() (charlm sample CKPT --prompt SOURCE)",
            "encoder": "it restores hidden characters: use fill() (charlm fill CKPT --prompt 'ROM_O')",
        }[self.config.model.arch]
        return UsageError(
            f"{self.path} is a{'n' * (self.config.model.arch != 'decoder')} {self.config.model.arch} "
            f"model, not {wanted}; {instead}"
        )

    @property
    def decoder(self) -> GPT:
        """The module as a decoder-only model, or a one-line error naming what this model does instead."""
        if not isinstance(self.module, GPT):
            raise self._wrong_arch("a decoder")
        return self.module

    @property
    def encoder_decoder(self) -> EncoderDecoder:
        if not isinstance(self.module, EncoderDecoder):
            raise self._wrong_arch("an encoder-decoder")
        return self.module

    @property
    def encoder(self) -> EncoderOnly:
        if not isinstance(self.module, EncoderOnly):
            raise self._wrong_arch("an encoder")
        return self.module

    @classmethod
    def from_checkpoint(cls, ckpt: Checkpoint, device: str = "auto", precision: str = "float32") -> Model:
        """precision: float32, or int8 weights for faster CPU decoding (charlm.models.quantize)."""
        module = for_decoding(ckpt.build_model(pick_device(device)).eval(), precision)
        return cls(module, ckpt.tokenizer, ckpt.config, ckpt.path)

    @property
    def device(self) -> torch.device:
        return next(self.module.parameters()).device

    def __repr__(self) -> str:
        m = self.config.model
        return (
            f"charlm.Model({str(self.path)!r}: {m.n_layer} layers x {m.n_embd} wide, context {m.block_size}, "
            f"{self.tokenizer.vocab_size} characters)"
        )

    # -- generation --------------------------------------------------------------------------

    def encode_prompt(
        self, prompt: str, unknown: UnknownPolicy = "error", replace_with: str | None = None
    ) -> list[int]:
        """The prompt's ids; characters outside the vocabulary are an error unless `unknown` says skip or replace."""
        return encode_prompt(self.tokenizer, prompt, unknown, replace_with)

    def sample(
        self, prompt_ids: list[int], options: DecodeOptions, on_text: Callable[[str], None] | None = None
    ) -> SampleResult:
        """Every sample of one batch, with timing (what `charlm sample` prints); on_text streams sample 0."""
        return sample(self.decoder, self.tokenizer, prompt_ids, options, on_text=on_text)

    def generate(
        self,
        prompt: str = "\n",
        max_new_tokens: int | None = None,
        temperature: float | None = None,
        top_k: int | None = None,
        top_p: float | None = None,
        seed: int | None = None,
        stop: list[str] | None = None,
        unknown: UnknownPolicy = "error",
        compile: bool = False,
    ) -> str:
        """The prompt and its continuation. Options left as None take the checkpoint's `sample` settings; `compile`
        compiles the decoding step once for this model (`charlm sample --compile`: faster for long texts)."""
        options = DecodeOptions.from_config(
            self.config.sample,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            seed=seed,
            stop=stop,
            compile=compile,
        ).checked(field_name)
        return self.sample(self.encode_prompt(prompt, unknown), options).samples[0]

    # -- scoring -----------------------------------------------------------------------------

    def evaluate(
        self,
        text_or_path: str | Path | None = None,
        split: str | None = None,
        unknown: UnknownPolicy = "error",
        replace_with: str | None = None,
        batch_size: int = 64,
        stride: int | None = None,
    ) -> EvalResult:
        """Loss (nats per character, or per byte for a byte model), bits and perplexity in one deterministic pass.

        A Path, or a one-line string naming an existing file or folder, is read as a corpus (prepared once, then
        memory-mapped); any other string is the text itself; None is the model's own corpus. `split` (train, val,
        test, all) defaults to val of the model's own corpus and to all of anything else. `stride` (1..block_size)
        overlaps the windows so that each scored token sees at least block_size - stride earlier ones.
        """
        if isinstance(self.module, EncoderDecoder):
            raise UsageError("an encoder-decoder is scored on pairs: use evaluate_pairs() (charlm eval does)")
        if isinstance(self.module, EncoderOnly):
            raise UsageError("an encoder is scored on hidden characters: use evaluate_masked() (charlm eval does)")
        own, data = self.config.data.path, self.config.data
        if text_or_path is None or _names_a_file(text_or_path):
            path = str(text_or_path if text_or_path is not None else own)
            split = split or ("val" if _same_file(path, own) else "all")
            source = dataclasses.replace(data, path=path)
            corpus = Corpus.from_config(source, self.tokenizer, unknown, replacement=replace_with)
        else:
            source_name, split = "<text>", split or "all"
            ids = encode_compact(
                self.tokenizer.encode(str(text_or_path), unknown, replace_with), self.tokenizer.vocab_size
            )
            corpus = (
                Corpus.from_ids(ids, self.tokenizer, data, source_name)
                if split != "all"
                else Corpus(self.tokenizer, ids, ids[:0], ids[:0], source_name, ids)
            )
        if split not in ("train", "val", "test", "all"):
            raise UsageError(f"split must be train, val, test or all, got {split!r}")
        ids = corpus.split(split)
        if len(ids) < 2:
            raise UsageError(f"the {split} split of {corpus.source} has fewer than 2 tokens to score")
        block_size = self.config.model.block_size
        if stride is not None and not 1 <= stride <= block_size:
            raise UsageError(f"--stride must be between 1 and the model's context ({block_size}), got {stride}")
        with self.scoring_kernels():
            result = full_pass(self.decoder, ids, block_size, self.device, batch_size, stride=stride)
        result.split, result.file, result.unit = split, corpus.source, self.tokenizer.unit
        return result

    def attention(self, prompt: str, unknown: UnknownPolicy = "error") -> torch.Tensor:
        """Attention weights for a prompt of at most the context length: (n_layer, n_head, T, T), rows summing to 1."""
        ids = self.encode_prompt(prompt, unknown)
        if len(ids) > self.config.model.block_size:
            raise UsageError(
                f"the prompt has {len(ids)} characters but the model's context is "
                f"{self.config.model.block_size}: shorten it"
            )
        x = torch.tensor([ids], device=self.device)
        module = self.module if isinstance(self.module, EncoderOnly) else self.decoder  # an encoder's: full
        return module.attention_weights(x)[:, 0].float().cpu()  # (L, nh, T, T)

    def info(self) -> ModelInfo:
        """Parameters per component and training FLOPs per token (`.to_dict()` for plain data)."""
        return model_info(self.config.model, self.tokenizer.vocab_size)


def load(path: str | Path, device: str = "auto", precision: str = "float32") -> Model:
    """A checkpoint file (or a run folder: its best.pt) as a Model on `device` (auto: cuda, then mps, then cpu).

    precision="int8" stores the blocks' weight matrices as int8 for decoding on the CPU (about 3x faster batch-1
    sampling of a 6 x 384 model whose float32 weights outgrow the cache); the output head, and layers whose input
    width is not a multiple of 16, stay float32; the text can differ from float32's (charlm.models.quantize)."""
    return Model.from_checkpoint(load_model_file(path), device, precision)


def export(checkpoint: str | Path, out_dir: str | Path) -> list[Path]:
    """Write model.safetensors, config.json, vocab.json and a README.md model card to out_dir (storage.export)."""
    from charlm.storage.export import model_card, write_export

    ckpt = load_model_file(checkpoint)
    model = Model.from_checkpoint(ckpt, "cpu")
    params = model.module.num_params()
    scores: dict[str, Any] | None = None
    if isinstance(model.module, EncoderDecoder):
        from charlm.data.pairs import PairCorpus
        from charlm.storage.export import transducer_card

        try:
            corpus = PairCorpus.from_config(ckpt.config.data, ckpt.config.model.block_size, model.tokenizer)
        except UsageError:  # the training pairs are not here: the card says so
            card = transducer_card(ckpt, params, None, [], Path(out_dir))
        else:
            sources = [model.tokenizer.decode(s) for s, _ in corpus.val[:5]]
            examples = list(zip(sources, model.transduce(sources), strict=True))
            scores = model.evaluate_pairs().to_dict()
            card = transducer_card(ckpt, params, scores, examples, Path(out_dir))
        return write_export(ckpt, Path(out_dir), card)
    if isinstance(model.module, EncoderOnly):
        from charlm.storage.export import encoder_card

        try:
            scores = model.evaluate_masked().to_dict()
        except UsageError:  # the training corpus is not here: the card says so
            scores = None
        try:
            example = model.fill("ROM_O AND JUL_ET")["text"]
        except UsageError:  # characters it has never seen, or a context shorter than the example
            example = ""
        return write_export(ckpt, Path(out_dir), encoder_card(ckpt, params, scores, example, Path(out_dir)))
    try:
        scores = model.evaluate().to_dict()
    except UsageError:  # the training corpus is not here: the card says so
        scores = None
    sample_text = model.generate("\n", max_new_tokens=300, seed=1).strip("\n")
    return write_export(ckpt, Path(out_dir), model_card(ckpt, params, scores, sample_text, Path(out_dir)))


def _names_a_file(value: str | Path) -> bool:
    return isinstance(value, Path) or ("\n" not in value and len(value) < 4096 and Path(value).exists())


def train(
    config: str | Path = cfg.DEFAULT_CONFIG,
    overrides: dict[str, Any] | None = None,
    data: str | Path | None = None,
    out_dir: str | Path | None = None,
    *,
    resume: bool = False,
    overwrite: bool = False,
    quiet: bool = False,
    init_from: str | Path | None = None,
    extend_vocab: bool = False,
) -> dict[str, Any]:
    """Train like `charlm train` and return its summary (the fields of `train --json`).

    `init_from` fine-tunes: the run starts from that checkpoint's, run folder's or export's weights, shape and
    vocabulary (`extend_vocab` adds the new text's unseen characters instead of refusing them).

    `overrides` maps dotted keys to values ({"train.max_steps": 200}). Ctrl-C (KeyboardInterrupt) stops the run
    after saving last.pt and propagates; no signal handler is installed and the process is never exited.
    """
    from charlm.training.run import resolve_run

    options = {key: (key, value) for key, value in (overrides or {}).items()}  # typed values, no YAML round trip
    options["data.path"] = ("data", None if data is None else str(data))
    request = resolve_run(
        str(config), [], options, out_dir, resume=resume, overwrite=overwrite, init_from=init_from,
        extend_vocab=extend_vocab,
    )  # fmt: skip
    summary = request.run(quiet=quiet)
    return summary.to_dict() if summary is not None else {}
