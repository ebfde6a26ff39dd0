"""The encoder-decoder family (model.arch: encoder-decoder): the original Transformer trained on source<TAB>target
lines to rewrite a source string into its target, scored by exact match and error rates."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from charlm.config.schema import Config, ModelConfig
from charlm.data.corpus import for_file, same_path, split_file
from charlm.data.features import FEATURE_RANGE, is_feature_symbol
from charlm.data.hallucinate import hallucinated
from charlm.data.pairs import Pair, PairBatches, PairCorpus, unseen_of
from charlm.data.recombine import recombined
from charlm.data.tokenizer import (
    BOS,
    SPECIAL_CHARS,
    SPECIAL_CODES,
    UNKNOWN_CHAR,
    Tokenizer,
    UnknownPolicy,
    refuse_special_replacement,
    restore_unknown,
)
from charlm.decoding.options import DecodeOptions, field_name
from charlm.decoding.rewrite import rewrite
from charlm.decoding.steps import GraphRuntime, Models, RuntimeCheck, members
from charlm.errors import UsageError
from charlm.evaluation.loss import EvalResult
from charlm.evaluation.transduction import TransductionResult, pairs_total, score_pairs
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
from charlm.families.losses import PairLosses
from charlm.hardware.distributed import Dist
from charlm.models.encoder_decoder import EncoderDecoder
from charlm.models.info import ModelInfo, encoder_decoder_info
from charlm.models.onnx_graphs import Graph, encoder_decoder_graphs


class EncoderDecoderFamily(Family[PairCorpus, EncoderDecoder]):
    name = "encoder-decoder"
    noun = "an encoder-decoder"
    does = "it rewrites a source string: charlm sample {ckpt} --prompt SOURCE (transduce() in Python)"
    module_type = EncoderDecoder
    rewrites_sources = True
    scored_by = "an encoder-decoder is scored on pairs: use evaluate_pairs() (charlm eval does)"

    data_noun = "lines"

    def corpus(
        self, config: Config, tokenizer: Tokenizer | None, say: Callable[[str], None], hint: str | None
    ) -> PairCorpus:
        return PairCorpus.from_config(config.data, config.model.block_size, tokenizer, say, hint or "")

    def batches(self, config: Config, corpus: PairCorpus, device: torch.device, seed: int) -> PairBatches:
        unknown_id = getattr(corpus.tokenizer, "stoi", {}).get(UNKNOWN_CHAR)  # pairs are read as characters
        tc, dropout = config.train, config.data.unknown_dropout
        made = hallucinated(corpus.train, corpus.tokenizer, config.data.hallucinate, tc.seed)  # the same on every rank
        space = getattr(corpus.tokenizer, "stoi", {}).get(" ")  # phones are space-separated: a unit's sounds are tokens
        made += recombined(corpus.train, space, config.data.recombine, tc.seed, config.model.block_size - 1)
        return PairBatches(corpus.train + made, tc.batch_size, device, seed, unknown_id, dropout)

    def periodic_losses(
        self, config: Config, corpus: PairCorpus, device: torch.device, amp: torch.dtype | None, dist: Dist
    ) -> PairLosses:
        return PairLosses(config, corpus, device, amp, dist)

    def final_pass(
        self, model: EncoderDecoder, corpus: PairCorpus, config: Config, device: torch.device, amp: torch.dtype | None
    ) -> tuple[EvalResult, bool]:
        total, count = pairs_total(model, corpus.val, device, amp_dtype=amp)  # every target character
        return EvalResult(total / count, count, "val", config.data.path), True

    def info(self, config: ModelConfig, vocab_size: int) -> ModelInfo:
        return encoder_decoder_info(config, vocab_size)

    def as_encoder_decoder(self, loaded: Loaded) -> EncoderDecoder:
        return loaded.module

    def onnx_graphs(self, model: EncoderDecoder) -> list[Graph]:
        if not model.config.cross_attention:
            raise UsageError(
                "model.cross_attention=false: this decoder never reads the encoder, so there is no encoder graph to "
                "export to ONNX; use --format safetensors"
            )
        return encoder_decoder_graphs(model)

    def onnx_check(self, loaded: Loaded, runtime: GraphRuntime) -> RuntimeCheck:
        from charlm.families.onnx_checks import encoder_decoder_check

        return encoder_decoder_check(loaded, self.as_encoder_decoder(loaded), runtime)

    def score(self, loaded: Loaded, data: str | None, split: str | None, options: dict[str, Any]) -> Any:
        if options.get("stride") is not None:
            raise UsageError("--stride slides windows over a text; an encoder-decoder is scored line by line")
        keys = ("beam", "batch_size", "unknown", "replace_with", "ensemble")
        return evaluate_pairs(loaded, data, split, **{k: options[k] for k in keys if k in options})

    def card_facts(self, loaded: Loaded, steps: int) -> CardFacts:
        data = loaded.config.data
        try:
            corpus = PairCorpus.from_config(data, loaded.config.model.block_size, loaded.tokenizer)
        except UsageError:  # the training pairs are not here: the card says so
            return encoder_decoder_facts(loaded, steps, None, [])
        sources = [shown_source(loaded.tokenizer, s) for s, _ in corpus.val[:5]]
        examples = list(zip(sources, rewrite_sources(loaded, sources), strict=True))
        scores = evaluate_pairs(loaded).to_dict()
        return encoder_decoder_facts(loaded, steps, scores, examples)


Rewrite = Callable[[list[list[int]], DecodeOptions], list[list[int]]]  # sources' ids, options -> targets' ids


def rewrite_sources(
    loaded: Loaded,
    sources: list[str],
    options: DecodeOptions | None = None,
    unknown: UnknownPolicy = "error",
    replace_with: str | None = None,
    ensemble: Sequence[Loaded] = (),
) -> list[str]:
    """charlm.Model.rewrite: each source's target as `options` say (default greedy, up to the context), decoded by
    the model's own runtime; with `ensemble`, by this model and those together."""
    rewrite_ids: Rewrite = loaded.rewriter(ensemble)  # first: it refuses what its runtime cannot do
    ids = [encode_source(loaded, s, unknown, replace_with) for s in sources]
    options = options or DecodeOptions(temperature=0.0, max_new_tokens=loaded.config.model.block_size)
    targets = [loaded.tokenizer.decode(t) for t in rewrite_ids(ids, options.checked(field_name))]
    known, features = set(getattr(loaded.tokenizer, "chars", [])), loaded.tokenizer.features is not None
    chars = [s.partition("\t")[0] if features else s for s in sources]  # SOURCE<TAB>FEATURES: the characters
    return [restore_unknown(t, unseen_of(c, known)) for t, c in zip(targets, chars, strict=True)]


def torch_rewriter(loaded: Loaded, ensemble: Sequence[Loaded] = ()) -> Rewrite:
    """How a torch model rewrites sources (with `ensemble`, together with those models)."""
    models = ensemble_models(loaded, ensemble)
    return lambda ids, options: rewrite(models, ids, options)


def tags(loaded: Loaded) -> list[str]:
    """A model's features in their symbols' order (none without a features column): what its feature ids mean."""
    features = loaded.tokenizer.features
    return features.model_tags() if features is not None else []


def ensemble_models(loaded: Loaded, ensemble: Sequence[Loaded] = ()) -> Models:
    """The torch model of `loaded`, or with `ensemble` the list of it and theirs: encoder-decoders run by torch that
    share its vocabulary, context and device (an ensemble averages predictions over one set of characters)."""
    if not ensemble:
        return loaded.family.as_encoder_decoder(loaded)
    models = [loaded.family.as_encoder_decoder(loaded)]
    for member in ensemble:
        for which in (loaded, member):
            if which.runtime != "torch":
                raise UsageError(f"--ensemble needs torch models; {which.path} is an ONNX export: use checkpoints")
        models.append(member.family.as_encoder_decoder(member))  # another family: refused in one line
        if member.tokenizer.chars != loaded.tokenizer.chars or tags(member) != tags(loaded):
            raise UsageError(
                f"--ensemble {member.path}: its vocabulary differs from that of {loaded.path}; an ensemble's models "
                "must be trained on the same characters (the same data)"
            )
        if member.config.model.block_size != loaded.config.model.block_size:
            raise UsageError(
                f"--ensemble {member.path}: its context is {member.config.model.block_size} characters, that of "
                f"{loaded.path} {loaded.config.model.block_size}; an ensemble's models must share model.block_size"
            )
        if member.device != loaded.device:
            raise UsageError(f"--ensemble {member.path} is on {member.device}, {loaded.path} on {loaded.device}")
    return models


def encode_source(
    loaded: Loaded, source: str, unknown: UnknownPolicy = "error", replace_with: str | None = None
) -> list[int]:
    """A source's ids: not empty, within the context, without the reserved control characters; with a features
    column, given as SOURCE<TAB>FEATURES, each feature one input."""
    if any(c in SPECIAL_CHARS for c in source):
        raise UsageError(f"a source may not hold {SPECIAL_CODES} (the padding, start and end symbols)")
    if unknown == "replace":
        refuse_special_replacement(replace_with, "the replacement character")
    if not source:
        raise UsageError("a source must have at least one character")
    source = source_inputs(loaded.tokenizer, source, unknown != "error")
    chars = loaded.tokenizer.chars
    if unknown == "replace" and replace_with is None and " " not in chars and UNKNOWN_CHAR not in chars:
        replace_with = chars[len(SPECIAL_CHARS)]  # the first real character, never padding
    ids = loaded.encode_prompt(source, unknown, replace_with)
    block_size = loaded.config.model.block_size
    if not ids or len(ids) > block_size:
        raise UsageError(
            f"a source must have 1 to {block_size} characters (the model's context), got {len(ids)}: {source[:40]!r}"
        )
    return ids


def source_inputs(tokenizer: Tokenizer, source: str, unknown_ok: bool = True) -> str:
    """A source as the encoder reads it: as given, or with a features column its characters then one symbol per
    feature (charlm/data/features.py); a feature the model never saw is refused unless `unknown_ok`."""
    if tokenizer.features is None:
        return source
    if any(is_feature_symbol(c) for c in source):
        raise UsageError(f"a source may not hold characters of {FEATURE_RANGE}: they stand for features")
    return tokenizer.features.given_source(source, unknown_ok)


def unseen_inputs(tokenizer: Tokenizer, source: str) -> int:
    """How many of a given source's inputs the model never saw: characters, and with a features column features."""
    known = set(getattr(tokenizer, "chars", []))
    if tokenizer.features is None:
        return sum(c not in known for c in source)
    chars, _, features = source.partition("\t")
    return sum(c not in known for c in chars) + len(tokenizer.features.unseen_tags(features))


def shown_source(tokenizer: Tokenizer, ids: list[int]) -> str:
    """A source's ids as users write the source: with a features column, SOURCE<TAB>FEATURES."""
    text = tokenizer.decode(ids)
    return tokenizer.features.shown(text) if tokenizer.features is not None else text


def transduction_attention(loaded: Loaded, source: str, unknown: UnknownPolicy = "error") -> dict[str, Any]:
    """charlm.Model.transduction_attention: the maps of a source and its greedy target."""
    module = loaded.family.as_encoder_decoder(loaded)
    src = encode_source(loaded, source, unknown)
    target = loaded.tokenizer.encode(rewrite_sources(loaded, [source])[0])
    device = loaded.device
    maps = module.attention_weights(torch.tensor([src], device=device), torch.tensor([[BOS, *target]], device=device))
    decode = loaded.tokenizer.decode
    return {
        "source": [loaded.tokenizer.label(i) for i in src],
        "target": [decode([i]) for i in target] + ["⟨end⟩"],
        **{name: weights[:, 0].float().cpu() for name, weights in maps.items()},
    }


PairScorer = Callable[[list[Pair], DecodeOptions, int], TransductionResult]  # pairs, options, batch size


def torch_scorer(loaded: Loaded, ensemble: Sequence[Loaded] = ()) -> PairScorer:
    """How a torch model scores pairs (with `ensemble`, together with those models): the teacher-forced loss and the
    decoded targets, with the linear kernels its run scored with."""
    models = ensemble_models(loaded, ensemble)

    def score(scored: list[Pair], options: DecodeOptions, batch_size: int) -> TransductionResult:
        with loaded.scoring_kernels():
            decode = loaded.tokenizer.decode
            by_models = lambda sources: rewrite(models, sources, options)  # noqa: E731
            return score_pairs(members(models), decode, scored, by_models, options.beam, batch_size)

    return score


def evaluate_pairs(
    loaded: Loaded,
    path: str | Path | None = None,
    split: str | None = None,
    beam: int = 1,
    batch_size: int = 64,
    unknown: UnknownPolicy | None = None,
    replace_with: str | None = None,
    ensemble: Sequence[Loaded] = (),
) -> TransductionResult:
    """charlm.Model.evaluate_pairs: target loss, exact match, character and token error rates on a paired file (every
    reference of a source counted); characters the model never saw are refused, skipped or replaced (`unknown`;
    default: replaced by the unknown symbol where the model learned one, data.unknown_dropout, else refused).
    The chosen pairs are scored by the model's pair_scorer (the torch model's own score_pairs unless it gives one);
    with `ensemble`, by this model and those together (their mean log-probabilities)."""
    own_scorer: PairScorer | None = None if ensemble else loaded.pair_scorer(beam)  # an export's own, or torch's:
    scorer = own_scorer if own_scorer is not None else torch_scorer(loaded, ensemble)  # (an ensemble needs torch)
    own = loaded.config.data.path
    given = str(path) if path is not None else own
    split = split or ("val" if same_path(given, own) else "all")
    data = for_file(loaded.config.data, given, split)
    room = loaded.config.model.block_size
    hint = "use --unknown replace to read them as a stand-in character, or --unknown skip to leave their lines out"
    unknown = unknown or ("replace" if UNKNOWN_CHAR in getattr(loaded.tokenizer, "stoi", {}) else "error")
    skipped: list[str] = []  # the model's data.skip_bad_lines leaves lines out: said, never silent
    corpus = PairCorpus.from_config(
        data, room, loaded.tokenizer, skipped.append, hint=hint, unknown=unknown, replacement=replace_with
    )
    scored = corpus.split(split)
    if not scored:
        raise UsageError(f"the {split} split of {given} holds no line to score (--unknown skip left them all out?)")
    options = DecodeOptions(beam=beam, batch_size=batch_size, temperature=0.0, max_new_tokens=room).checked(field_name)
    result = scorer(scored, options, batch_size)
    result.split, result.file = split, split_file(data, split)
    unseen = corpus.unknown_counts.get(result.file)
    if unseen is not None:
        result.unknown_chars, result.unknown_lines, result.unknown_target_lines, result.unknown_features = unseen
    result.skipped = skipped
    return result


def encoder_decoder_facts(
    loaded: Loaded, steps: int, scores: dict[str, Any] | None, examples: list[tuple[str, str]]
) -> CardFacts:
    """An encoder-decoder's card: its shape, its validation figures, and a few of its rewrites."""
    source = "SOURCE\tFEATURES" if loaded.tokenizer.features is not None else "SOURCE"
    m = loaded.config.model
    quality = None
    if scores:
        tokens = scores["token_error_rate"]  # None where the targets have no whitespace-separated tokens
        quality = Quality(
            f"validation split of {DATA}, greedy: ",
            f"exact match {100 * scores['exact_match']:.2f}%",
            f", character error rate {100 * scores['char_error_rate']:.2f}%"
            + (f", token error rate {100 * tokens:.2f}%" if tokens is not None else "")
            + f"; target loss {scores['loss']:.4f} nats/char",
        )
    shape = shape_row(m, f"{m.n_encoder_layer or m.n_layer} encoder + {m.n_layer} decoder layers")
    parts = (
        f"{m.pos_encoding} positions, {m.norm} ({m.norm_position}), {m.activation} feed-forward x{m.ffn_mult:g}, "
        f"{'shared' if m.share_embeddings else 'separate'} source/target embeddings, "
        f"{'tied' if m.tie_weights else 'untied'} head"
    )
    return CardFacts(
        title="character-level encoder-decoder",
        data=data_name(loaded.config),
        summary=(
            "An encoder-decoder Transformer rewriting a source string into a target string, over "
            f"{loaded.tokenizer.vocab_size}\ncharacters (ids 0, 1, 2: padding, start, end), trained with charlm on "
            f"the pairs of {DATA}."
        ),
        rows=(shape, ("parts", parts), parameters_row(loaded), training_row(loaded.config.train, steps)),
        quality=quality,
        data_missing=f"the training pairs {DATA} were",
        commands=card_commands(loaded.tokenizer.features is not None),
        python=(f"model = charlm.load({FOLDER})", f"print(model.transduce({source!r}, beam=5))"),
        example_heading="Some validation sources and what it makes of them (greedy)",
        example="\n".join(f"{source}\t{target}" for source, target in examples)
        or "(no validation pairs at export time)",
    )


def card_commands(features: bool) -> tuple[str, str]:
    """The card's commands: a source is typed with its features after a tab where the model reads a features column."""
    if features:
        return (
            f"charlm sample {FOLDER} --prompt $'SOURCE\\tFEATURES'  # greedy; --beam 5 for beam search",
            f"charlm sample {FOLDER} --prompt-file covered.tsv   # source<TAB>features lines, the target added",
        )
    return (
        f'charlm sample {FOLDER} --prompt "SOURCE"            # greedy; --beam 5 for beam search',
        f"charlm sample {FOLDER} --prompt-file words.txt      # source<TAB>target for every line",
    )
