"""The encoder family (model.arch: encoder): BERT's masked-character objective at character level, scored by how
well hidden characters are restored, used to fill blanks in a text."""

from __future__ import annotations

from numbers import Integral
from pathlib import Path
from typing import Any, cast

import torch
from torch import nn

from charlm.config.schema import Config, ModelConfig
from charlm.data.corpus import Corpus, for_file, same_path, split_file
from charlm.data.masking import MaskedWindows
from charlm.decoding.fill import fill
from charlm.decoding.options import MAX_FILL_CANDIDATES
from charlm.decoding.steps import GraphRuntime, RuntimeCheck
from charlm.errors import UsageError, shell_path
from charlm.evaluation.loss import EvalResult
from charlm.evaluation.masked import MaskedResult, all_windows, masked_score
from charlm.families.base import (
    AnyCorpus,
    Family,
    Loaded,
    data_name,
    num_params,
    optimizer_name,
    python_path,
)
from charlm.families.decoder import validation_ids
from charlm.families.losses import WindowLosses
from charlm.hardware.distributed import Dist
from charlm.models.encoder import EncoderOnly
from charlm.models.info import ModelInfo, encoder_info
from charlm.models.onnx_graphs import Graph, encoder_graphs


class EncoderFamily(Family):
    name = "encoder"
    noun = "an encoder"
    does = "it restores hidden characters: charlm fill {ckpt} --prompt 'ROM_O' (fill() in Python)"
    module_type = EncoderOnly
    scored_by = "an encoder is scored on hidden characters: use evaluate_masked() (charlm eval does)"

    def batches(self, config: Config, corpus: AnyCorpus, device: torch.device, seed: int) -> MaskedWindows:
        T, V = config.model.block_size, corpus.tokenizer.vocab_size
        return MaskedWindows(cast(Corpus, corpus).train, T, config.train.batch_size, device, seed, V)

    def periodic_losses(
        self, config: Config, corpus: AnyCorpus, device: torch.device, amp: torch.dtype | None, dist: Dist
    ) -> WindowLosses:
        def score(model: nn.Module, ids: torch.Tensor, starts: torch.Tensor, device: torch.device, amp: Any) -> Any:
            total, _, count = masked_score(cast(EncoderOnly, model), ids, starts, device, amp_dtype=amp)
            return total, count  # the loss of restoring hidden characters, hidden alike each time

        return WindowLosses(config, cast(Corpus, corpus), device, amp, dist, score)

    def final_pass(
        self, model: nn.Module, corpus: AnyCorpus, config: Config, device: torch.device, amp: torch.dtype | None
    ) -> tuple[EvalResult, bool]:
        val, whole = validation_ids(cast(Corpus, corpus), config)  # every whole window, its characters hidden alike
        total, _, count = masked_score(cast(EncoderOnly, model), val, all_windows(val, config.model.block_size), device)
        return EvalResult(total / max(count, 1), count, "val", config.data.path), whole

    def info(self, config: ModelConfig, vocab_size: int) -> ModelInfo:
        return encoder_info(config, vocab_size)

    def as_encoder(self, loaded: Loaded) -> EncoderOnly:
        return cast(EncoderOnly, loaded.module)

    def attention_module(self, loaded: Loaded) -> EncoderOnly:
        return self.as_encoder(loaded)  # full attention: every character sees every other

    def onnx_graphs(self, module: nn.Module) -> list[Graph]:
        return encoder_graphs(cast(EncoderOnly, module))

    def onnx_check(self, loaded: Loaded, runtime: GraphRuntime) -> RuntimeCheck:
        from charlm.families.onnx_checks import encoder_check

        return encoder_check(loaded, self.as_encoder(loaded), runtime)

    def score(self, loaded: Loaded, data: str | None, split: str | None, options: dict[str, Any]) -> MaskedResult:
        if options.get("stride") is not None or options.get("beam", 1) != 1:
            raise UsageError("--stride and --beam are not for an encoder: it is scored on hidden characters")
        return evaluate_masked(loaded, data, split)

    def card(self, loaded: Loaded, steps: int, folder: Path, files: str) -> str:
        try:
            scores: dict[str, Any] | None = evaluate_masked(loaded).to_dict()
        except UsageError:  # the training corpus is not here: the card says so
            scores = None
        try:
            example = fill_blanks(loaded, "ROM_O AND JUL_ET")["text"]
        except UsageError:  # characters it has never seen, or a context shorter than the example
            example = ""
        return encoder_card(loaded, steps, scores, example, folder, files)


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
    guesses = fill(module, loaded.encode_prompt(known), blanks, top)
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


def encoder_card(
    loaded: Loaded, steps: int, scores: dict[str, Any] | None, example: str, folder: Path, files: str
) -> str:
    """The model card of an encoder: its shape, how well it restores hidden characters, and a filled example."""
    m, t = loaded.config.model, loaded.config.train
    data = data_name(loaded.config)
    quality = (
        f"validation split of `{data}`: **{100 * scores['accuracy']:.2f}% of hidden characters restored** (15% of "
        f"each window hidden), loss {scores['loss']:.4f} nats per hidden character"
        if scores
        else f"not measured here: the training corpus `{data}` was not found at export time"
    )
    filled = f"\n`ROM_O AND JUL_ET` is filled as `{example}`.\n" if example else ""
    return f"""# charlm character-level encoder

An encoder-only Transformer (BERT's masked-character objective) over {loaded.tokenizer.vocab_size} characters and a
mask symbol, trained with charlm on `{data}`.

| | |
|---|---|
| shape | {m.n_layer} layers, {m.n_head} heads, {m.n_embd} wide, context {m.block_size} characters |
| training | {steps:,} steps of batch {t.batch_size} x {t.grad_accum}, {optimizer_name(t)} ({t.lr_schedule}) |
| parameters | {num_params(loaded.module):,} |
| quality | {quality} |
{filled}
## Use it

```bash
charlm fill {shell_path(folder)} --prompt "ROM_O AND JUL_ET"     # every _ filled at once, with the top candidates
```

```python
import charlm
print(charlm.load({python_path(folder)}).fill("ROM_O AND JUL_ET")["text"])
```

{files}
"""
