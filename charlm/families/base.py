"""What every model family answers: how to build its model, batch and score its data, use and describe a trained
model. The trainer, the scoring, the Python API, the exports and the command line call these, never asking which
family they hold; an operation a family does not have is refused in one line saying what it does instead."""

from __future__ import annotations

import abc
import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, NamedTuple, Protocol, TypeVar

import torch
from torch import nn

from charlm.config.schema import Config, ModelConfig, TrainConfig
from charlm.data.corpus import Corpus
from charlm.data.lines import LineCorpus
from charlm.data.pairs import PairCorpus
from charlm.data.tokenizer import Tokenizer, UnknownPolicy
from charlm.decoding.generate import encode_prompt as encode_text_prompt
from charlm.decoding.steps import GraphRuntime, RuntimeCheck
from charlm.errors import UsageError, shell_path
from charlm.evaluation.loss import EvalResult
from charlm.evaluation.loss import surprisal as text_surprisal
from charlm.hardware.distributed import Dist
from charlm.models.info import ModelInfo
from charlm.models.onnx_graphs import Graph

AnyCorpus = Corpus | PairCorpus | LineCorpus
CorpusT = TypeVar("CorpusT", Corpus, PairCorpus, LineCorpus)  # a family's training data
ModuleT = TypeVar("ModuleT", bound=nn.Module)  # a family's torch module


class Loaded(Protocol):
    """A trained model as the Python API holds it (charlm.Model): what the families' operations use of it."""

    @property
    def module(self) -> Any: ...  # the family's torch module, or an export's stand-in with its forward (OnnxForward)

    @property
    def tokenizer(self) -> Tokenizer: ...

    @property
    def config(self) -> Config: ...

    @property
    def path(self) -> Path: ...

    @property
    def family(self) -> Family[Any, Any]: ...

    @property
    def device(self) -> torch.device: ...

    @property
    def runtime(self) -> str: ...  # what computes the logits: torch, or onnxruntime for an ONNX export

    def encode_prompt(
        self, prompt: str, unknown: UnknownPolicy = "error", replace_with: str | None = None
    ) -> list[int]: ...

    def scoring_kernels(self) -> contextlib.AbstractContextManager: ...

    def pair_scorer(self, beam: int) -> Any: ...

    def rewriter(self, ensemble: Sequence[Loaded] = ()) -> Any: ...


class Batches(Protocol):
    """A family's training batches: next_batch() gives (inputs, targets); last_tokens counts the targets scored."""

    last_tokens: int
    generator: torch.Generator  # re-seeded when a run resumes with another number of processes

    def next_batch(self) -> tuple[Any, torch.Tensor]: ...

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...


class PeriodicLosses(Protocol):
    """The train and validation estimates of each periodic evaluation (every DDP rank scores its share)."""

    def losses(self, model: nn.Module, step: int) -> tuple[float, float]: ...

    def accuracy(self, model: nn.Module) -> float | None:
        """train.best_by accuracy: the validation lines' exact-match share (only pairs decode theirs)."""
        ...


# Where a card's phrases name the training data and the export's folder: the card fills them in, marked up as its
# Markdown needs (charlm/storage/model_card.py), so that a family's phrases stay plain text.
DATA = "{data}"
FOLDER = "{folder}"


class Quality(NamedTuple):
    """How well a model does, said in one phrase: `lead` and `rest` around the headline `figure`."""

    lead: str
    figure: str
    rest: str


class InlineExample(NamedTuple):
    """One text given to the model and what it made of it, said in a line under the table: PROMPT VERB OUTPUT."""

    prompt: str
    verb: str
    output: str


@dataclass(frozen=True)
class CardFacts:
    """What an export's model card says that only the model's family knows, as plain text (DATA and FOLDER where
    the training data and the export's folder go); charlm/storage/model_card.py lays it out as README.md."""

    title: str  # what the card's heading calls the model: "character-level language model"
    data: str  # the training data's file name (data_name)
    summary: str  # a paragraph: what the model is, over which symbols, trained on what
    rows: tuple[tuple[str, str], ...]  # the table's rows above quality: shape, parts, parameters, training
    quality: Quality | None  # its validation figures; None: its training data was not here at export time
    data_missing: str  # how the card says the training data was not found: "the training corpus {data} was"
    commands: tuple[str, ...]  # shell lines that use it ({folder}: the export)
    python: tuple[str, ...]  # Python lines that use it, after `import charlm`
    inline_example: InlineExample | None = None  # one example said in a line under the table
    example_heading: str = ""  # the heading of a last section of its output ("": none)
    example: str = ""  # that section's text


def shape_row(model: ModelConfig, layers: str = "", reach: str = "") -> tuple[str, str]:
    """Layers, heads, width and context; `layers` and `reach` where a family's differ from a decoder's."""
    layers = layers or f"{model.n_layer} layers"
    reach = reach or f"context {model.block_size} characters"
    return "shape", f"{layers}, {model.n_head} heads, {model.n_embd} wide, {reach}"


def parameters_row(loaded: Loaded) -> tuple[str, str]:
    return "parameters", f"{num_params(loaded.module):,}"


def training_row(train: TrainConfig, steps: int, batch_unit: str = "") -> tuple[str, str]:
    """How long and how it was trained; `batch_unit` names what a batch counts where that is not windows."""
    batch = f"{train.batch_size} x {train.grad_accum}{batch_unit}"
    return "training", f"{steps:,} steps of batch {batch}, {optimizer_name(train)} ({train.lr_schedule})"


class Family(abc.ABC, Generic[CorpusT, ModuleT]):
    """One architecture (model.arch). Subclasses say what they are and implement the operations every family has;
    the `as_...` views refuse, in one line, on every family but their own."""

    name = ""  # the model.arch value
    noun = ""  # "a decoder": as messages name it
    does = ""  # what it does instead: the command ({ckpt}: the model's path) and the Python call that do it
    module_type: type[ModuleT]  # the torch module of the family
    data_noun = "text"  # what its corpus holds, as messages name it
    continues_text = False  # a text model: `charlm sample` continues prompts, --init-from can start from it
    rewrites_sources = False  # `charlm sample` and `eval` take source strings and give targets (pairs)
    makes_items = False  # `charlm sample` makes whole items, each ended by the end symbol (data.format lines)
    scored_by = ""  # how this family is scored when charlm.Model.evaluate (a text's loss) is asked of it

    # -- training -----------------------------------------------------------------------------

    def build(self, config: ModelConfig, vocab_size: int) -> ModuleT:
        """A fresh model (weights initialised as its class does)."""
        return self.module_type(config, vocab_size)

    def own(self, module: nn.Module) -> ModuleT:
        """A module the trainer or an export holds, as this family's class (a module of another class is a bug)."""
        if not isinstance(module, self.module_type):
            raise TypeError(f"{self.noun} needs a {self.module_type.__name__}, got {type(module).__name__}")
        return module

    @abc.abstractmethod
    def corpus(
        self, config: Config, tokenizer: Tokenizer | None, say: Callable[[str], None], hint: str | None
    ) -> CorpusT:
        """The run's prepared corpus, read with `tokenizer` where a resumed or fine-tuned run brings one (characters
        outside it refused with `hint`), else with the characters of the training file."""

    @abc.abstractmethod
    def batches(self, config: Config, corpus: CorpusT, device: torch.device, seed: int) -> Batches:
        """This rank's training batches."""

    @abc.abstractmethod
    def periodic_losses(
        self, config: Config, corpus: CorpusT, device: torch.device, amp: torch.dtype | None, dist: Dist
    ) -> PeriodicLosses:
        """What each periodic evaluation scores."""

    @abc.abstractmethod
    def final_pass(
        self, model: ModuleT, corpus: CorpusT, config: Config, device: torch.device, amp: torch.dtype | None
    ) -> tuple[EvalResult, bool]:
        """The validation split scored whole (up to train.final_eval_tokens), and whether it was whole."""

    @abc.abstractmethod
    def info(self, config: ModelConfig, vocab_size: int) -> ModelInfo:
        """Parameters per component and training FLOPs per token."""

    # -- a trained model ----------------------------------------------------------------------

    def refuse(self, loaded: Loaded, wanted: str) -> UsageError:
        """The one-line error for an operation this family does not have: what the model is and does instead."""
        does = self.does.format(ckpt=shell_path(loaded.path))
        return UsageError(f"{loaded.path} is {self.noun}, not {wanted}; {does}")

    @abc.abstractmethod
    def score(self, loaded: Loaded, data: str | None, split: str | None, options: dict[str, Any]) -> Any:
        """`charlm eval`: the family's own figures for a file (default: its corpus's validation split). options:
        beam, stride, batch_size, unknown, replace_with, ensemble; a family refuses, by flag, those it cannot use."""

    @abc.abstractmethod
    def card_facts(self, loaded: Loaded, steps: int) -> CardFacts:
        """What the README.md of an export says of the model: what it is, how well it does, how to use it (scored
        and sampled here, with the training data where it still is)."""

    # -- ONNX exports ---------------------------------------------------------------------------

    @abc.abstractmethod
    def onnx_graphs(self, module: ModuleT) -> list[Graph]:
        """The graphs an ONNX export of this family holds (charlm/models/onnx_graphs.py)."""

    @abc.abstractmethod
    def onnx_check(self, loaded: Loaded, runtime: GraphRuntime) -> RuntimeCheck:
        """The exported graphs run by `runtime` against the torch model: logits on a few inputs, greedy output."""

    # -- using a trained model ----------------------------------------------------------------

    def encode_prompt(
        self, loaded: Loaded, prompt: str, unknown: UnknownPolicy = "error", replace_with: str | None = None
    ) -> list[int]:
        """A prompt's ids: not empty, characters outside the vocabulary refused unless `unknown` says otherwise."""
        return encode_text_prompt(loaded.tokenizer, prompt, unknown, replace_with)

    def surprisal(self, loaded: Loaded, ids: list[int]) -> tuple[list[str], list[float | None]]:
        """The server's score view: each character, and -ln p of it given those before (None: nothing before it)."""
        if len(ids) < 2:
            raise UsageError("text needs at least 2 characters: the first one has nothing before it")
        nats: list[float] = text_surprisal(self.as_decoder(loaded), ids, loaded.config.model.block_size)
        return [loaded.tokenizer.decode([i]) for i in ids], [None, *nats]

    def item_frame(self, loaded: Loaded) -> Any:
        """A lines model's framing of items (charlm.decoding.items.ItemFrame); None for every other family."""
        return None

    def as_lines(self, loaded: Loaded) -> Any:
        raise self.refuse(loaded, "a lines model (data.format lines), which makes whole items")

    def as_decoder(self, loaded: Loaded) -> Any:
        raise self.refuse(loaded, "a decoder")

    def as_encoder_decoder(self, loaded: Loaded) -> Any:
        raise self.refuse(loaded, "an encoder-decoder")

    def as_encoder(self, loaded: Loaded) -> Any:
        raise self.refuse(loaded, "an encoder")

    def attention_module(self, loaded: Loaded) -> Any:
        """The module whose self-attention `charlm attention` shows for one text (an encoder-decoder has three maps:
        charlm.Model.transduction_attention)."""
        raise self.refuse(loaded, "a decoder")


def text_corpus(config: Config, tokenizer: Tokenizer | None, say: Callable[[str], None], hint: str | None) -> Corpus:
    """The corpus of a family that trains on running text (a decoder, an encoder): data.path's characters, or the
    given tokenizer's with characters outside it refused naming `hint`."""
    if tokenizer is None:
        return Corpus.from_config(config.data, say=say)
    return Corpus.from_config(config.data, tokenizer, say=say, hint=hint or "")


def num_params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def data_name(config: Config) -> str:
    """The training data as an export records it: its file (or folder) name, never the path on the trainer's disk."""
    return Path(config.data.path).name


def optimizer_name(train: TrainConfig) -> str:
    if train.optimizer == "muon":
        return f"Muon lr {train.muon_lr:g} for the blocks' matrices, AdamW lr {train.lr:g} for the rest"
    return f"AdamW lr {train.lr:g}"
