"""The lines family (model.arch decoder with data.format lines): a GPT trained on whole items, one per line, each
between the start and end symbols; scored per character with the end symbol counted and per item, used to make
more items like them (makemore's task)."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from charlm.config.schema import Config, ModelConfig
from charlm.data.corpus import for_file, same_path, split_file
from charlm.data.lines import (
    KnownItems,
    LineBatches,
    LineCorpus,
    check_items,
    encode_items,
    item_room,
    known_items,
    numbered_items,
)
from charlm.data.tokenizer import (
    BOS,
    EOS,
    PAD,
    SPECIAL_CHARS,
    SPECIAL_CODES,
    Tokenizer,
    UnknownPolicy,
    refuse_special_replacement,
)
from charlm.decoding.generate import SampleResult
from charlm.decoding.items import MOST_DRAWS, DrawnItem, ItemFrame, sample_items, sample_until
from charlm.decoding.options import DecodeOptions
from charlm.errors import UsageError
from charlm.evaluation.items import ItemsResult, item_logprobs, items_total, score_items
from charlm.evaluation.loss import EvalResult
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
    training_row,
)
from charlm.families.losses import RankShare
from charlm.hardware.distributed import Dist
from charlm.models.decoder import Decoder
from charlm.models.info import ModelInfo, decoder_info

END = "⟨end⟩"  # how the end symbol is shown where a character would be


class LinesFamily(Family[LineCorpus, Decoder]):
    """The decoder's module and shape; its own data, scores and uses."""

    name = "decoder"
    noun = "a lines model"
    does = "it makes whole items, one per line: charlm sample {ckpt} --num-samples N (sample_items() in Python)"
    module_type = Decoder
    makes_items = True
    scored_by = "a lines model is scored item by item: use score() (charlm eval) or score_items() (charlm score)"

    data_noun = "items"

    def corpus(
        self, config: Config, tokenizer: Tokenizer | None, say: Callable[[str], None], hint: str | None
    ) -> LineCorpus:
        return LineCorpus.from_config(config.data, config.model.block_size, tokenizer, say, hint or "")

    def batches(self, config: Config, corpus: LineCorpus, device: torch.device, seed: int) -> LineBatches:
        return LineBatches(corpus.train, config.train.batch_size, device, seed)

    def periodic_losses(
        self, config: Config, corpus: LineCorpus, device: torch.device, amp: torch.dtype | None, dist: Dist
    ) -> ItemLosses:
        return ItemLosses(config, corpus, device, amp, dist)

    def final_pass(
        self, model: Decoder, corpus: LineCorpus, config: Config, device: torch.device, amp: torch.dtype | None
    ) -> tuple[EvalResult, bool]:
        total, count = items_total(model, corpus.val, device, amp_dtype=amp)  # every item whole
        return EvalResult(total / count, count, "val", config.data.path), True

    def score(self, loaded: Loaded, data: str | None, split: str | None, options: dict[str, Any]) -> ItemsResult:
        if options.get("beam", 1) != 1:
            raise UsageError("--beam is for encoder-decoder models; a lines model's items are scored whole")
        if options.get("stride") is not None:
            raise UsageError("--stride slides windows over a text; a lines model scores each item whole")
        keys = ("unknown", "replace_with", "batch_size")
        return evaluate_items(loaded, data, split, **{k: options[k] for k in keys if k in options})

    def info(self, config: ModelConfig, vocab_size: int) -> ModelInfo:
        return decoder_info(config, vocab_size)

    def onnx_graphs(self, module: nn.Module) -> Any:
        # The ONNX runtime's decoding loop knows nothing of start and end symbols: its samples would not be items.
        raise UsageError("a lines model has no ONNX export yet: export it as safetensors (leave out --format onnx)")

    def onnx_check(self, loaded: Loaded, runtime: Any) -> Any:
        return self.onnx_graphs(loaded.module)

    def as_decoder(self, loaded: Loaded) -> Decoder:
        return loaded.module

    def as_lines(self, loaded: Loaded) -> Decoder:
        return self.as_decoder(loaded)

    def attention_module(self, loaded: Loaded) -> Decoder:
        return self.as_decoder(loaded)

    def item_frame(self, loaded: Loaded) -> ItemFrame:
        return ItemFrame(BOS, EOS, (PAD, BOS), loaded.config.model.block_size)

    def encode_prompt(
        self, loaded: Loaded, prompt: str, unknown: UnknownPolicy = "error", replace_with: str | None = None
    ) -> list[int]:
        """An item's beginning: empty (a whole item), or characters the model knows that leave room for one more."""
        if any(c in SPECIAL_CHARS for c in prompt):
            raise UsageError(f"the prompt may not hold {SPECIAL_CODES} (the padding, start and end symbols)")
        if unknown == "replace":
            refuse_special_replacement(replace_with, "the replacement character")
        hint = "use --unknown skip or --unknown replace to accept them"
        if unknown == "skip":  # the prompt's unknown characters are dropped, not the prompt
            prompt = "".join(c for c in prompt if c in loaded.tokenizer.chars)
        ids = encode_items([prompt], loaded.tokenizer, unknown, replace_with, hint, "the prompt")[0]
        room = item_room(loaded.config.model.block_size)
        if len(ids) > room:
            raise UsageError(
                f"the prompt has {len(ids)} characters, but this model's items hold at most {room} (its context "
                "less the start symbol): shorten it"
            )
        return ids

    def surprisal(self, loaded: Loaded, ids: list[int]) -> tuple[list[str], list[float | None]]:
        """Each character of one item and its end symbol, every one predicted (the first from the start symbol)."""
        if len(ids) > item_room(loaded.config.model.block_size):
            raise UsageError(f"an item holds at most {item_room(loaded.config.model.block_size)} characters")
        return item_surprisal(self.as_lines(loaded), loaded, ids)

    def card_facts(self, loaded: Loaded, steps: int) -> CardFacts:
        try:
            scores: dict[str, Any] | None = evaluate_items(loaded).to_dict()
        except UsageError:  # the training list is not here: the card says so
            scores = None
        options = DecodeOptions.from_config(loaded.config.sample, num_samples=10, seed=1)
        items = sample_lines(loaded, [], options).samples
        return lines_facts(loaded, steps, scores, items)


class ItemLosses(RankShare):
    """The first train.eval_windows items of each (shuffled) split, every character and end symbol."""

    def __init__(self, config: Config, corpus: LineCorpus, device: torch.device, amp: torch.dtype | None, dist: Dist):
        super().__init__(device, dist)
        n = config.train.eval_windows
        self.train, self.val, self.amp = corpus.train[:n], corpus.val[:n], amp

    def losses(self, model: nn.Module, step: int) -> tuple[float, float]:
        return self._loss(model, self.train), self._loss(model, self.val)

    def _loss(self, model: nn.Module, items: list) -> float:
        mine = items[self.dist.rank :: self.dist.world_size]
        return self.mean(*items_total(model, mine, self.device, amp_dtype=self.amp))


@torch.no_grad()
def item_surprisal(module: Decoder, loaded: Loaded, ids: list[int]) -> tuple[list[str], list[float | None]]:
    x = torch.tensor([[BOS, *ids]], device=loaded.device)
    logits = module(x)[0][0].float()  # (T, V)
    nats = torch.nn.functional.cross_entropy(logits, torch.tensor([*ids, EOS], device=loaded.device), reduction="none")
    return [loaded.tokenizer.decode([i]) for i in ids] + [END], list(nats.tolist())


def line_corpus(
    loaded: Loaded,
    path: str | None = None,
    unknown: UnknownPolicy = "error",
    replace_with: str | None = None,
    split: str | None = None,
    say: Callable[[str], None] = lambda _: None,
) -> LineCorpus:
    """A file read and split as the model's own list was (the model's own list when path is None); another file
    scored whole (`split` "all") is not cut."""
    data = for_file(loaded.config.data, path or loaded.config.data.path, split)
    hint = "use --unknown skip to leave out the items that hold them"
    block_size = loaded.config.model.block_size
    return LineCorpus.from_config(
        data, block_size, loaded.tokenizer, say, hint=hint, unknown=unknown, replacement=replace_with
    )


def evaluate_items(
    loaded: Loaded,
    path: str | Path | None = None,
    split: str | None = None,
    unknown: UnknownPolicy = "error",
    replace_with: str | None = None,
    batch_size: int = 256,
) -> ItemsResult:
    """charlm eval: the loss per character (the end symbol counted) and per item over a split of a list (default:
    the validation split of the model's own list, all of any other file)."""
    own = loaded.config.data.path
    given = str(path) if path is not None else own
    split = split or ("val" if same_path(given, own) else "all")
    skipped: list[str] = []  # the model's data.skip_bad_lines leaves lines out: said, never silent
    corpus = line_corpus(loaded, given, unknown, replace_with, split, skipped.append)
    items = corpus.split(split)
    if not items:
        raise UsageError(f"the {split} split of {given} holds no item to score")
    texts = [loaded.tokenizer.decode(item) for item in items]
    with loaded.scoring_kernels():
        result = score_items(loaded.family.as_lines(loaded), items, texts, loaded.device, batch_size)
    result.split, result.file, result.scores = split, split_file(for_file(loaded.config.data, given), split), []
    result.skipped = skipped
    return result


def score_lines(
    loaded: Loaded,
    text: str,
    where: str = "the text",
    unknown: UnknownPolicy = "error",
    replace_with: str | None = None,
    batch_size: int = 256,
) -> ItemsResult:
    """charlm score: every non-empty line of a text as one item, its log-likelihood and nats per character, in the
    text's order; a line too long for the model or with characters it never saw is refused by number (`--unknown
    skip` leaves the latter out)."""
    module = loaded.family.as_lines(loaded)
    numbered = numbered_items(text)
    fix = "fix or remove them (each line is one item of this model)"
    strings = check_items(numbered, loaded.config.model.block_size, False, where, lambda _: None, fix)
    known = set(loaded.tokenizer.chars)
    if unknown == "skip":
        strings = [s for s in strings if set(s) <= known]
    for number, item in numbered if unknown == "error" else []:
        if missing := sorted(set(item) - known):
            shown = ", ".join(f"{c!r} (U+{ord(c):04X})" for c in missing[:10])
            raise UsageError(
                f"line {number} of {where} holds character(s) the model has never seen: {shown}; use --unknown "
                "skip to leave such lines out"
            )
    if not strings and numbered:
        raise UsageError(f"every line of {where} holds a character the model has never seen, and --unknown skip left "
                         f"all {len(numbered)} out; use --unknown replace to score them")  # fmt: skip
    if not strings:
        raise UsageError(f"{where} holds no line to score (one item per line; empty lines are skipped)")
    items = encode_items(strings, loaded.tokenizer, unknown, replace_with)
    with loaded.scoring_kernels():
        result = score_items(module, items, strings, loaded.device, batch_size)
    result.file = where
    return result


def sample_lines(
    loaded: Loaded, prompt_ids: list[int], options: DecodeOptions, on_text: Callable[[str], None] | None = None
) -> SampleResult:
    """charlm.Model.sample on a lines model: options.num_samples whole items, each begun by the prompt's ids and
    ended by the end symbol (not shown); on_text streams item 0."""
    module, frame = loaded.family.as_lines(loaded), loaded.family.item_frame(loaded)
    return sample_items(module, loaded.tokenizer, frame, prompt_ids, options, on_text).as_samples()


def draw_items(
    loaded: Loaded,
    prompt: str,
    options: DecodeOptions,
    novel: bool = False,
    unknown: UnknownPolicy = "error",
    replace_with: str | None = None,
) -> dict[str, Any]:
    """charlm sample on a lines model: options.num_samples items, each with its log-likelihood (items cut by a stop
    string or a cap have none), and how many of the draws were training items, held-out items (validation, test) and
    new (KnownItems.counts); `novel` draws until options.num_samples items are new, at most MOST_DRAWS per item asked
    for, and keeps only those (fewer when the draws ran out)."""
    family = loaded.family
    module, frame = family.as_lines(loaded), family.item_frame(loaded)  # another family is refused in one line
    prefix = family.encode_prompt(loaded, prompt, unknown, replace_with)
    known = run_items(loaded, novel)

    def keep(item: DrawnItem) -> bool:
        """With --novel, a whole item (ended by the end symbol, not empty) in none of the run's files."""
        return not novel or (item.ended == "end" and item.text != "" and known.kind(item.text) == "new")

    most = options.num_samples * (MOST_DRAWS if novel else 1)
    draws = sample_until(module, loaded.tokenizer, frame, prefix, options, keep, most)
    kept = [item for item in draws.items if keep(item)]
    whole = [i for i, item in enumerate(kept) if item.ended == "end"]
    ids = [loaded.tokenizer.encode(kept[i].text) for i in whole]
    logprobs = dict(zip(whole, item_logprobs(module, ids, loaded.device) if ids else [], strict=True))
    rows = [
        {
            "text": item.text,
            "logprob": logprobs.get(i),
            "per_char": -logprobs[i] / (len(item.text) + 1) if i in logprobs else None,
            "ended": item.ended,
        }
        for i, item in enumerate(kept)
    ]
    # what the draws were, among whole items: one cut by a cap, or empty, is no item of any list
    counts = known.counts([item.text for item in draws.items if item.ended == "end" and item.text], len(draws.items))
    return {"items": rows, "chars_per_s": draws.drawn / max(draws.seconds, 1e-9), **counts}


def run_items(loaded: Loaded, novel: bool = False) -> KnownItems:
    """The items of the files the model's run was trained, validated and tested on, read again as training read them
    (`known_items`). A file that cannot be read is refused in one line with `novel`, and with nothing left to compare
    with; otherwise the samples are just not told apart ("unchecked")."""
    data = loaded.config.data
    try:
        known = _READ.get(loaded) or known_items(data, loaded.config.model.block_size, loaded.tokenizer)
    except UsageError as e:
        if novel:
            raise UsageError(f"--novel compares samples with the items of the run's files: {e}") from None
        return KnownItems(set(), set(), [], [], unchecked=str(e))
    if novel and not known.read:
        raise UsageError(
            f"--novel compares samples with the items of the run's files, but none is still there ("
            f"{'; '.join(known.gone)} not found): put {data.path} back, or sample without --novel"
        )
    _READ[loaded] = known
    return known


# The run's items, read once per loaded model: a notebook sampling again and again re-reads no list.
_READ: weakref.WeakKeyDictionary[Any, KnownItems] = weakref.WeakKeyDictionary()


def lines_facts(loaded: Loaded, steps: int, scores: dict[str, Any] | None, items: list[str]) -> CardFacts:
    """A lines model's card: its shape, its loss per character and per item, and ten items it made."""
    m = loaded.config.model
    quality = (
        Quality(
            f"validation split of {DATA}: ",
            f"{scores['loss']:.4f} nats per character",
            f" (each item's end symbol counted), {scores['bpc']:.4f} bits; mean log-likelihood "
            f"{scores['mean_logprob']:.3f} nats per item",
        )
        if scores
        else None
    )
    shape = shape_row(m, reach=f"items of up to {item_room(m.block_size)} characters")  # less the start symbol
    return CardFacts(
        title="model of item lists",
        data=data_name(loaded.config),
        summary=(
            f"A decoder-only Transformer that makes more items like those of {DATA} (one per line), over\n"
            f"{loaded.tokenizer.vocab_size - len(SPECIAL_CHARS)} characters and ids 0, 1, 2 (padding, start, end), "
            "trained with\ncharlm."
        ),
        rows=(shape, parameters_row(loaded), training_row(loaded.config.train, steps, " items")),
        quality=quality,
        data_missing=f"the training list {DATA} was",
        commands=(
            f"charlm sample {FOLDER} --num-samples 20 --novel     # new items, in none of the run's files",
            f"charlm score candidates.txt {FOLDER} --sort         # rank your own candidates, one per line",
        ),
        python=(
            f"model = charlm.load({FOLDER})",
            'print(model.generate("", seed=1))                   # one whole item; a prompt is its beginning',
        ),
        example_heading=f"Ten items (seed 1, temperature {loaded.config.sample.temperature:g})",
        example="\n".join(items),
    )
