"""The Python API's methods for the other two architectures: an encoder-decoder's `transduce`, an encoder's
`fill`, and how each is scored and looked inside (mixed into charlm.api.model.Model)."""

from __future__ import annotations

import abc
import contextlib
import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from charlm.data.corpus import Corpus
from charlm.data.tokenizer import UnknownPolicy
from charlm.decoding.transduce import TransductionResult
from charlm.errors import UsageError
from charlm.models.encoder import MaskedResult
from charlm.models.linear import onednn_linears, onednn_problem, use_onednn

if TYPE_CHECKING:
    from charlm.config.schema import Config
    from charlm.data.tokenizer import Tokenizer
    from charlm.models.encoder import EncoderOnly
    from charlm.models.encoder_decoder import EncoderDecoder


class ArchMethods(abc.ABC):
    """Methods that exist for one architecture each; on another they raise a one-line UsageError (Model._wrong_arch).

    What they use of the model is declared here, abstract, and provided by charlm.api.model.Model.
    """

    tokenizer: Tokenizer
    config: Config

    @property
    @abc.abstractmethod
    def device(self) -> torch.device:
        """The device the model is on (charlm.api.model.Model provides it)."""

    @property
    @abc.abstractmethod
    def encoder(self) -> EncoderOnly:
        """The encoder-only module, or a one-line error naming what this model does (charlm.api.model.Model)."""

    @property
    @abc.abstractmethod
    def encoder_decoder(self) -> EncoderDecoder:
        """The encoder-decoder module, or a one-line error naming what this model does (charlm.api.model.Model)."""

    def scoring_kernels(self) -> contextlib.AbstractContextManager:
        """The linear layers' kernels the run's own final pass used (train.cpu_linear), so that scores agree with
        it; torch's, without complaint, where oneDNN cannot run."""
        on = onednn_problem() is None and use_onednn(self.device, self.config.train.cpu_linear)
        return onednn_linears(on)

    @abc.abstractmethod
    def encode_prompt(
        self, prompt: str, unknown: UnknownPolicy = "error", replace_with: str | None = None
    ) -> list[int]:
        """The prompt's ids, or a one-line error naming what cannot be encoded (charlm.api.model.Model)."""

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
    ) -> str | list[str]:
        """The target for a source (a list for a list): greedy by default, `beam` > 1 for beam search."""
        from charlm.decoding.options import DecodeOptions, field_name
        from charlm.decoding.transduce import transduce

        module = self.encoder_decoder
        many = [sources] if isinstance(sources, str) else list(sources)
        ids = [self.encode_source(s, unknown, replace_with) for s in many]
        options = DecodeOptions(
            beam=beam,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            seed=seed,
            max_new_tokens=self.config.model.block_size,
        ).checked(field_name)
        targets = [self.tokenizer.decode(t) for t in transduce(module, ids, options)]
        return targets[0] if isinstance(sources, str) else targets

    def encode_source(
        self, source: str, unknown: UnknownPolicy = "error", replace_with: str | None = None
    ) -> list[int]:
        """A source's ids: not empty, within the context, without the reserved control characters."""
        from charlm.data.tokenizer import SPECIAL_CHARS

        if any(c in SPECIAL_CHARS for c in source) or replace_with in SPECIAL_CHARS:
            raise UsageError("a source may not hold U+0000, U+0002 or U+0003 (reserved for padding, start and end)")
        if not source:
            raise UsageError("a source must have at least one character")
        if unknown == "replace" and replace_with is None and " " not in self.tokenizer.chars:
            replace_with = self.tokenizer.chars[len(SPECIAL_CHARS)]  # the first real character, never padding
        ids = self.encode_prompt(source, unknown, replace_with)
        if not ids or len(ids) > self.config.model.block_size:
            raise UsageError(
                f"a source must have 1 to {self.config.model.block_size} characters (the model's context), "
                f"got {len(ids)}: {source[:40]!r}"
            )
        return ids

    def transduction_attention(self, source: str, unknown: UnknownPolicy = "error") -> dict[str, Any]:
        """An encoder-decoder's attention on a source and its greedy target: {"source": chars, "target": chars
        (each decoder position's output, the last being the end), "encoder": (Le, nh, S, S), "decoder":
        (Ld, nh, T, T), "cross": (Ld, nh, T, S)}; rows are queries and sum to 1."""
        from charlm.data.tokenizer import BOS

        module = self.encoder_decoder
        src = self.encode_source(source, unknown)
        target = self.tokenizer.encode(str(self.transduce(source)))
        maps = module.attention_weights(
            torch.tensor([src], device=self.device), torch.tensor([[BOS, *target]], device=self.device)
        )
        decode = self.tokenizer.decode
        return {
            "source": [decode([i]) for i in src],
            "target": [decode([i]) for i in target] + ["⟨end⟩"],
            **{name: weights[:, 0].float().cpu() for name, weights in maps.items()},
        }

    def evaluate_pairs(
        self, path: str | Path | None = None, split: str | None = None, beam: int = 1, batch_size: int = 64
    ) -> TransductionResult:
        """An encoder-decoder on a paired file (default: its own, val split): target loss, exact match, character
        and token error rates of greedy (or beam) decoding."""
        from charlm.data.pairs import PairCorpus
        from charlm.decoding.options import DecodeOptions, field_name
        from charlm.decoding.transduce import score_pairs

        module = self.encoder_decoder
        own = self.config.data.path
        given = str(path) if path is not None else own
        split = split or ("val" if _same_file(given, own) else "all")
        data = dataclasses.replace(self.config.data, path=given)
        corpus = PairCorpus.from_config(data, self.config.model.block_size, self.tokenizer)
        room = self.config.model.block_size
        options = DecodeOptions(beam=beam, batch_size=batch_size, temperature=0.0, max_new_tokens=room)
        options.checked(field_name)
        with self.scoring_kernels():
            result = score_pairs(module, self.tokenizer.decode, corpus.split(split), options, batch_size)
        result.split, result.file = split, given
        return result

    def fill(self, text: str, mask_char: str = "_", top: int = 5) -> dict[str, Any]:
        """An encoder's guess for every `mask_char` of text: {"text": filled, "blanks": [{"position", "candidates":
        [[char, probability], ...]}]}, every blank predicted at once from the rest of the text."""
        from charlm.models.encoder import fill

        module = self.encoder
        if len(mask_char) != 1:
            raise UsageError(f"the mask character must be one character, got {mask_char!r}")
        blanks = [i for i, c in enumerate(text) if c == mask_char]
        if not blanks:
            raise UsageError(f"the text has no {mask_char!r} to fill: mark each hidden character with it")
        if len(text) > self.config.model.block_size:
            raise UsageError(
                f"the text has {len(text)} characters but the model's context is {self.config.model.block_size}"
            )
        known = "".join(self.tokenizer.decode([0]) if c == mask_char else c for c in text)  # a placeholder id
        unseen = self.tokenizer.unknown_chars(known)
        if unseen:
            shown = ", ".join(repr(c) for c in unseen[:10])
            raise UsageError(f"the text has characters the model has never seen: {shown}; leave them out")
        ids = self.encode_prompt(known)
        guesses = fill(module, ids, blanks, top)
        decode = self.tokenizer.decode
        filled = list(text)
        for position, candidates in zip(blanks, guesses, strict=True):
            filled[position] = decode([candidates[0][0]])
        return {
            "text": "".join(filled),
            "blanks": [
                {"position": p, "candidates": [[decode([i]), round(prob, 6)] for i, prob in cands]}
                for p, cands in zip(blanks, guesses, strict=True)
            ],
        }

    def evaluate_masked(self, path: str | Path | None = None, split: str | None = None) -> MaskedResult:
        """An encoder on a text (default: its own corpus, val split): 15% of each window hidden as in training
        (the same positions every time), the loss and the share restored exactly."""
        from charlm.models.encoder import all_windows, masked_score

        module = self.encoder
        own = self.config.data.path
        given = str(path) if path is not None else own
        split = split or ("val" if _same_file(given, own) else "all")
        corpus = Corpus.from_config(dataclasses.replace(self.config.data, path=given), self.tokenizer)
        ids = corpus.split(split)
        starts = all_windows(ids, self.config.model.block_size)
        if not len(starts):
            raise UsageError(
                f"the {split} split of {given} is shorter than one window ({self.config.model.block_size})"
            )
        with self.scoring_kernels():
            total, right, count = masked_score(module, ids, starts, self.device)
        return MaskedResult(total / count, right / count, count, split, given)


def _same_file(a: str | Path, b: str | Path) -> bool:
    try:
        return Path(a).resolve() == Path(b).resolve()
    except OSError:
        return False
