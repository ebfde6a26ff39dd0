"""charlm from Python: train a model, load one, generate text, score text, count parameters.

The commands use these same functions, so a notebook and the command line give the same figures and the same
`CharlmError` messages. Nothing here installs signal handlers or exits the process.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

import torch

from charlm.config.schema import Config
from charlm.data.tokenizer import Tokenizer, UnknownPolicy
from charlm.decoding.generate import SampleResult, SampleTexts, decode_text, sampling_steps, seeded_chooser
from charlm.decoding.options import DecodeOptions, field_name
from charlm.decoding.steps import TextSteps
from charlm.errors import UsageError
from charlm.evaluation.items import ItemsResult
from charlm.evaluation.loss import EvalResult
from charlm.evaluation.masked import MaskedResult
from charlm.evaluation.transduction import TransductionResult
from charlm.families import decoder as decoder_family
from charlm.families import encoder as encoder_family
from charlm.families import encoder_decoder as encoder_decoder_family
from charlm.families import lines as lines_family
from charlm.families.registry import AnyModel, family_for
from charlm.hardware.device import pick_device
from charlm.models.decoder import Decoder
from charlm.models.encoder import Encoder
from charlm.models.encoder_decoder import EncoderDecoder
from charlm.models.info import ModelInfo
from charlm.models.linear import onednn_linears, onednn_problem, use_onednn
from charlm.models.quantize import for_decoding
from charlm.storage.checkpoint import Checkpoint


class Model:
    """A trained model ready to use: `generate` (a decoder), `transduce` (an encoder-decoder) or `fill` (an encoder),
    `evaluate`, `info`; `module` is the plain torch.nn.Module, `family` what its architecture can do (charlm.families).
    A method of another family is refused in one line that says what this model does instead."""

    runtime = "torch"  # what computes the logits: torch, or onnxruntime for an ONNX export (OnnxModel)

    def __init__(self, module: AnyModel, tokenizer: Tokenizer, config: Config, path: Path):
        self.module, self.tokenizer, self.config, self.path = module, tokenizer, config, path
        self.family = family_for(config)

    @property
    def decoder(self) -> Decoder:
        """The module as a decoder-only model, or a one-line error naming what this model does instead."""
        return self.family.as_decoder(self)

    @property
    def encoder_decoder(self) -> EncoderDecoder:
        return self.family.as_encoder_decoder(self)

    @property
    def encoder(self) -> Encoder:
        return self.family.as_encoder(self)

    def require(self, kind: Literal["decoder", "encoder-decoder", "lines"]) -> None:
        """Refuse, in one line, a model that is not a `kind` (the error names what it is and does instead)."""
        views = {"decoder": self.family.as_decoder, "encoder-decoder": self.family.as_encoder_decoder}
        views |= {"lines": self.family.as_lines}
        if kind not in views:
            raise UsageError(f"kind must be one of {', '.join(views)}, got {kind!r}")
        views[kind](self)

    def scoring_kernels(self) -> contextlib.AbstractContextManager:
        """The linear layers' kernels the run's own final pass used (train.cpu_linear), so that scores agree with
        it; torch's, without complaint, where oneDNN cannot run."""
        on = onednn_problem() is None and use_onednn(self.device, self.config.train.cpu_linear)
        return onednn_linears(on)

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
        """The prompt's ids; characters outside the vocabulary are an error unless `unknown` says skip or replace (a
        lines model: an item's beginning, which may be empty)."""
        if not isinstance(prompt, str):
            raise UsageError(f"the prompt must be a string, got {prompt!r}")
        return self.family.encode_prompt(self, prompt, unknown, replace_with)

    def sample(
        self, prompt_ids: list[int], options: DecodeOptions, on_text: Callable[[str], None] | None = None
    ) -> SampleResult:
        """Every sample of one batch, with timing (what `charlm sample` prints); on_text streams sample 0. A lines
        model's samples are whole items, each ended by the end symbol (not shown)."""
        if self.family.makes_items:  # the lines family's own loop: items end at their end symbol
            return lines_family.sample_lines(self, prompt_ids, options, on_text)
        with self.text_steps(options) as steps:
            texts, choose = SampleTexts(self.tokenizer, prompt_ids, options, on_text), seeded_chooser(options)
            for next_ids in decode_text(steps, prompt_ids, options.max_new_tokens, options.num_samples, choose):
                if texts.feed(next_ids):  # every sample met a stop string
                    break
            return texts.result(steps.compile_seconds)

    def text_steps(self, options: DecodeOptions) -> contextlib.AbstractContextManager[TextSteps]:
        """What the decoding loop steps through (charlm.decoding.steps): the torch decoder's KV cache, or with
        options.compile a compiled step; an ONNX export's graphs (OnnxModel)."""
        return sampling_steps(self.family.as_decoder(self), options)

    def sample_items(
        self,
        prompt: str = "",
        options: DecodeOptions | None = None,
        novel: bool = False,
        unknown: UnknownPolicy = "error",
        replace_with: str | None = None,
    ) -> dict:
        """A lines model's items (`charlm sample`): {"items": [{"text", "logprob", "per_char", "ended"}], "sampled",
        "chars_per_s", "training", "held_out", "new", "new_share", "against"} (how many samples were items of the
        run's training split, of its validation or test split, or new; when none of the run's files can be read,
        "unchecked" says why instead, and "missing" names the files gone); `novel` draws until options.num_samples
        items are new, in none of the run's files, and keeps only those."""
        if options is not None and not isinstance(options, DecodeOptions):
            raise UsageError(f"options must be a charlm DecodeOptions (DecodeOptions.from_config), got {options!r}")
        prompt = string_argument(prompt, "prompt")
        options = options or DecodeOptions.from_config(self.config.sample)
        return lines_family.draw_items(self, prompt, options, novel, unknown, replace_with)

    def item_counts(self, texts: list[str]) -> dict:
        """A lines model's view of some texts: how many are items of the run's training split ("training"), of its
        validation or test split ("held_out"), or "new" (as sample_items counts its draws)."""
        self.require("lines")
        if not isinstance(texts, (list, tuple)) or not all(isinstance(t, str) for t in texts):
            raise UsageError(f"texts must be a list of strings, got {texts!r}")
        return lines_family.run_items(self).counts(list(texts))

    def score_items(self, text: str, where: str = "the text", **options: Any) -> ItemsResult:
        """A lines model (`charlm score`): each non-empty line of `text` as one item, its log-likelihood and nats per
        character in `.scores`, in the text's order; options: unknown, replace_with, batch_size."""
        return lines_family.score_lines(self, string_argument(text, "text"), where, **options)

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
        return decoder_family.evaluate_text(self, text_or_path, split, unknown, replace_with, batch_size, stride)

    def evaluate_pairs(
        self,
        path: str | Path | None = None,
        split: str | None = None,
        beam: int = 1,
        batch_size: int = 64,
        unknown: UnknownPolicy | None = None,
        replace_with: str | None = None,
        ensemble: Sequence[Model] = (),
    ) -> TransductionResult:
        """An encoder-decoder on a paired file (default: its own, val split): target loss, exact match, character
        and token error rates of greedy (or beam) decoding, a source right if it matches any of its lines;
        characters the model never saw refused, their lines skipped, or replaced (`unknown`; default: replaced by
        the unknown symbol where the model learned one, data.unknown_dropout, else refused). `ensemble`: other
        encoder-decoders of the same vocabulary that decode and score with this one (their mean log-probabilities)."""
        return encoder_decoder_family.evaluate_pairs(
            self, path, split, beam, batch_size, unknown, replace_with, _models(ensemble)
        )

    def pair_scorer(self, beam: int) -> Any:
        """What scores an encoder-decoder's pairs in evaluate_pairs: None, the torch model's own score_pairs (an
        export run by another runtime gives its own)."""
        return None

    def evaluate_masked(self, path: str | Path | None = None, split: str | None = None) -> MaskedResult:
        """An encoder on a text (default: its own corpus, val split): 15% of each window hidden as in training
        (the same positions every time), the loss and the share restored exactly."""
        return encoder_family.evaluate_masked(self, path, split)

    def score(self, data: str | None = None, split: str | None = None, **options: Any) -> Any:
        """`charlm eval`: whichever of evaluate, evaluate_pairs and evaluate_masked this model's family scores by;
        options: beam, stride, batch_size, unknown, replace_with, ensemble (a family refuses those it cannot use)."""
        if options.get("ensemble") and not self.family.rewrites_sources:
            raise self.family.refuse(self, "an encoder-decoder (--ensemble decodes with several of them)")
        return self.family.score(self, data, split, options)

    # -- the other families' uses --------------------------------------------------------------

    def transduce(
        self,
        sources: str | list[str],
        beam: int = 1,
        temperature: float = 0.0,
        top_k: int | None = None,
        top_p: float = 1.0,
        seed: int | None = None,
        unknown: UnknownPolicy = "error",
        replace_with: str | None = None,
        ensemble: Sequence[Model] = (),
    ) -> str | list[str]:
        """An encoder-decoder's target for a source (a list for a list): greedy by default, `beam` > 1 for beam
        search; with `ensemble` (other encoder-decoders of the same vocabulary), decoded by all of them together."""
        room = self.config.model.block_size
        options = DecodeOptions(beam=beam, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)
        targets = self.rewrite(
            sources_argument(sources), options.with_(max_new_tokens=room), unknown, replace_with, ensemble
        )
        return targets[0] if isinstance(sources, str) else targets

    def rewrite(
        self,
        sources: str | list[str],
        options: DecodeOptions | None = None,
        unknown: UnknownPolicy = "error",
        replace_with: str | None = None,
        ensemble: Sequence[Model] = (),
    ) -> list[str]:
        """Each source's target (a list, one source or many), its decoding one DecodeOptions record: beam, temperature,
        top-k, top-p, seed and max_new_tokens (the most characters of a target, the context less one at most). None
        is greedy and whole; a record is taken as it is, so DecodeOptions() samples at its temperature 0.8 (give
        temperature=0 for greedy or a beam). `charlm sample` and `charlm serve` call this; transduce() is the same
        with keywords."""
        many = sources_argument(sources)
        if options is not None and not isinstance(options, DecodeOptions):
            raise UsageError(f"options must be a charlm DecodeOptions, got {options!r}")
        if options is not None and (options.stop or options.num_samples != 1 or options.compile):
            raise UsageError(
                "an encoder-decoder writes one whole target per source: stop, num_samples and compile are a "
                "decoder's options; leave them out"
            )
        return encoder_decoder_family.rewrite_sources(self, many, options, unknown, replace_with, _models(ensemble))

    def rewriter(self, ensemble: Sequence[Any] = ()) -> Any:
        """How this model rewrites sources' ids under DecodeOptions: torch's decoding loop (an export run by another
        runtime gives its own)."""
        return encoder_decoder_family.torch_rewriter(self, ensemble)

    def encode_source(
        self, source: str, unknown: UnknownPolicy = "error", replace_with: str | None = None
    ) -> list[int]:
        """A source's ids: not empty, within the context, without the reserved control characters."""
        return encoder_decoder_family.encode_source(self, source, unknown, replace_with)

    def unseen_inputs(self, source: str) -> int:
        """How many inputs of an encoder-decoder's source (as given: SOURCE<TAB>FEATURES with a features column) the
        model never saw: what --unknown refuses or replaces."""
        return encoder_decoder_family.unseen_inputs(self.tokenizer, string_argument(source, "source"))

    def transduction_attention(self, source: str, unknown: UnknownPolicy = "error") -> dict[str, Any]:
        """An encoder-decoder's attention on a source and its greedy target: {"source": chars, "target": chars
        (each decoder position's output, the last being the end), "encoder": (Le, nh, S, S), "decoder":
        (Ld, nh, T, T), "cross": (Ld, nh, T, S)}; rows are queries and sum to 1."""
        return encoder_decoder_family.transduction_attention(self, string_argument(source, "source"), unknown)

    def fill(self, text: str, mask_char: str = "_", top: int = 5) -> dict[str, Any]:
        """An encoder's guess for every `mask_char` of text: {"text": filled, "blanks": [{"position", "candidates":
        [[char, probability], ...]}]}, every blank predicted at once from the rest of the text."""
        return encoder_family.fill_blanks(self, text, mask_char, top)

    def attention(self, prompt: str, unknown: UnknownPolicy = "error") -> torch.Tensor:
        """Attention weights for a prompt of at most the context length: (n_layer, n_head, T, T), rows summing to 1."""
        ids = self.encode_prompt(prompt, unknown)
        if not ids:  # a lines model's prompt carries no start symbol of its own
            raise UsageError("the prompt is empty; give at least one character to look at")
        if len(ids) > self.config.model.block_size:
            raise UsageError(
                f"the prompt has {len(ids)} characters but the model's context is "
                f"{self.config.model.block_size}: shorten it"
            )
        x = torch.tensor([ids], device=self.device)
        module = self.family.attention_module(self)  # a decoder's causal, an encoder's full
        return module.attention_weights(x)[:, 0].float().cpu()  # (L, nh, T, T)

    def info(self) -> ModelInfo:
        """Parameters per component and training FLOPs per token (`.to_dict()` for plain data)."""
        return self.family.info(self.config.model, self.tokenizer.vocab_size)


def string_argument(value: Any, what: str) -> str:
    """One string from the API's caller, or one line saying what else came."""
    if isinstance(value, str):
        return value
    raise UsageError(f"{what} must be a string, got {value!r}")


def sources_argument(sources: Any) -> list[str]:
    """transduce's sources: one string, or a list of them (torch and ONNX models alike)."""
    if isinstance(sources, str):
        return [sources]
    if isinstance(sources, (list, tuple)) and all(isinstance(v, str) for v in sources):
        return list(sources)
    raise UsageError(f"sources must be a string or a list of strings, got {sources!r}")


def _models(ensemble: Any) -> list[Any]:
    """An ensemble as the API takes it: loaded models (charlm.load), never paths (the CLI's --ensemble loads those)."""
    if isinstance(ensemble, (list, tuple)) and all(hasattr(m, "family") for m in ensemble):  # torch or ONNX
        return list(ensemble)
    raise UsageError(f"ensemble must be a list of models loaded with charlm.load, got {ensemble!r}")
