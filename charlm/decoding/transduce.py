"""Rewriting sources into targets with an encoder–decoder: batched greedy or sampled decoding, beam search, and the
metrics of transduction (exact match, character and token error rates).

The encoder runs once per batch of sources; the decoder is KV-cached, one new character per step for every row. An
ensemble (several models of one vocabulary and context, given as a list) decodes and is scored on the mean of its
members' log-probabilities, renormalised: the product of their distributions.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from charlm.data.corpus import IGNORE
from charlm.data.pairs import Pair, ReplacedSource, ReplacedTarget, pad_batch, pairs_total
from charlm.data.tokenizer import BOS, EOS, PAD
from charlm.decoding.options import DecodeOptions
from charlm.decoding.sampling import sample_next
from charlm.models.encoder_decoder import EncoderDecoder

Models = EncoderDecoder | Sequence[EncoderDecoder]  # one model, or an ensemble's members


def members(model: Models) -> list[EncoderDecoder]:
    """The models that decode: the one given, or an ensemble's members."""
    return list(model) if isinstance(model, Sequence) else [model]


@torch.no_grad()
def transduce(model: Models, sources: list[list[int]], options: DecodeOptions) -> list[list[int]]:
    """The target ids (without BOS/EOS) for every source, in the order given."""
    for m in members(model):
        m.eval()
    generator = torch.Generator()  # the CPU's on every device (decoding.sampling)
    generator.manual_seed(options.seed if options.seed is not None else torch.seed())  # no seed: a fresh draw
    results: dict[int, list[int]] = {}
    order = sorted(range(len(sources)), key=lambda i: len(sources[i]))  # similar lengths together: less padding
    for first in range(0, len(order), options.batch_size):
        chosen = order[first : first + options.batch_size]
        batch = [sources[i] for i in chosen]
        if options.beam > 1:
            outputs = beam_batch(model, batch, options)
        else:
            outputs = _decode_batch(model, batch, options, generator)
        results.update(zip(chosen, outputs, strict=True))
    return [results[i] for i in range(len(sources))]


def target_room(block_size: int) -> int:
    """The most characters a target may have: the start symbol takes the first of the context's positions. A target
    this long ran out of room before its end symbol (it was cut, not finished)."""
    return block_size - 1


def _limit(model: Models, options: DecodeOptions) -> int:
    room = target_room(members(model)[0].config.block_size)  # an ensemble shares its context
    return min(options.max_new_tokens, room)


class TargetSteps:
    """The target side of transduction, one position at a time for every row: the sources encoded once by each model
    (each repeated `copies` times, one row per beam), a KV cache per model, and next-character logits in which
    padding and the start symbol are never chosen. Greedy, sampled and beam decoding all step through it."""

    def __init__(self, model: Models, sources: list[list[int]], copies: int = 1):
        self.models = members(model)
        self.device = next(self.models[0].parameters()).device
        (src, _), _ = pad_batch([(s, []) for s in sources], self.device)
        self.memory, self.key_mask, self.caches = [], [], []
        for m in self.models:
            encoded, key_mask = m.encode(src)  # once per source
            if copies > 1:
                encoded, key_mask = encoded.repeat_interleave(copies, dim=0), key_mask.repeat_interleave(copies, dim=0)
            self.memory.append(m.memory(encoded))
            self.key_mask.append(key_mask)
            self.caches.append(m.new_cache(len(sources) * copies, self.device))

    def logits(self, token: torch.Tensor) -> torch.Tensor:
        """Each row's next-character logits (R, V) after feeding it `token` (R, 1); an ensemble's are its members'
        mean log-probabilities."""
        each = []
        for m, memory, key_mask, cache in zip(self.models, self.memory, self.key_mask, self.caches, strict=True):
            logits = m.decode(token, memory, key_mask, cache)[:, -1].float()  # (R, V)
            logits[:, [PAD, BOS]] = -math.inf  # never written inside a target
            each.append(logits)
        if len(each) == 1:
            return each[0]
        return torch.stack([torch.log_softmax(logits, dim=-1) for logits in each]).mean(0)  # (R, V)

    def keep_rows(self, index: torch.Tensor) -> None:
        """Continue from these rows (beam search: the hypotheses kept, in their new order)."""
        for cache in self.caches:
            cache.select_rows(index)


def _decode_batch(
    model: Models, sources: list[list[int]], options: DecodeOptions, generator: torch.Generator
) -> list[list[int]]:
    steps = TargetSteps(model, sources)
    token = torch.full((len(sources), 1), BOS, dtype=torch.long, device=steps.device)  # (B, 1)
    out: list[list[int]] = [[] for _ in sources]
    done = torch.zeros(len(sources), dtype=torch.bool, device=steps.device)
    for _ in range(_limit(model, options)):
        logits = steps.logits(token)  # (B, V)
        nxt = sample_next(logits, generator, options.temperature, options.top_k, options.top_p)  # (B,)
        for row, t in enumerate(nxt.tolist()):
            if not done[row] and t != EOS:
                out[row].append(t)
        done |= nxt == EOS
        if bool(done.all()):
            break
        token = nxt[:, None]
    return out


def beam_search(model: Models, source: list[int], options: DecodeOptions) -> list[int]:
    """One source's best target by beam search (see beam_batch)."""
    return beam_batch(model, [source], options)[0]


def beam_batch(model: Models, sources: list[list[int]], options: DecodeOptions) -> list[list[int]]:
    """Beam search for a batch of sources at once: row b·N + k of the decoder holds beam k of source b.

    A hypothesis ends at EOS; the best is the one with the highest mean log-probability per character (EOS
    included), so short hypotheses are not favoured merely for having fewer terms (length normalisation). A
    source stops once N hypotheses have ended and no live one scores better than the best ended one so far.
    """
    B, N, limit = len(sources), options.beam, _limit(model, options)
    steps = TargetSteps(model, sources, copies=N)  # each source encoded once, then shared by its N rows
    device = steps.device
    scores = torch.full((B, N), -math.inf, device=device)
    scores[:, 0] = 0.0  # one live beam to begin with: no duplicates
    beams: list[list[list[int]]] = [[[] for _ in range(N)] for _ in range(B)]
    finished: list[list[tuple[float, list[int]]]] = [[] for _ in range(B)]
    done = [False] * B
    token = torch.full((B * N, 1), BOS, dtype=torch.long, device=device)
    for length in range(1, limit + 2):
        logp = torch.log_softmax(steps.logits(token), dim=-1)  # (B·N, V)
        V = logp.size(-1)
        if length > limit:  # no room for another character: every live hypothesis ends here, with its EOS
            ends = (scores + logp[:, EOS].view(B, N)).tolist()
            for b in range(B):
                if not done[b]:
                    finished[b] += [(ends[b][k] / length, beams[b][k]) for k in range(N) if ends[b][k] > -math.inf]
            break
        total = (scores[:, :, None] + logp.view(B, N, V)).view(B, N * V)
        best = total.topk(min(2 * N, N * V), dim=-1)  # room for those that end here
        values, indices = best.values.tolist(), best.indices.tolist()
        rows, next_tokens, next_scores = [], [], []
        for b in range(B):
            live: list[tuple[int, int]] = []  # (beam it continues, token)
            live_scores: list[float] = []
            for score, index in zip(values[b], indices[b], strict=True):
                if done[b] or score == -math.inf:
                    break
                beam, t = divmod(index, V)
                if t == EOS:
                    finished[b].append((score / length, beams[b][beam]))
                elif len(live) < N:
                    live.append((beam, t))
                    live_scores.append(score)
            if not done[b]:
                ended = max((f[0] for f in finished[b]), default=-math.inf)
                settled = len(finished[b]) >= N and max(live_scores, default=-math.inf) / length <= ended
                if not live or settled:
                    done[b], live, live_scores = True, [], []
                beams[b] = [beams[b][beam] + [t] for beam, t in live] + [[] for _ in range(N - len(live))]
            next_scores.append(live_scores + [-math.inf] * (N - len(live_scores)))
            live += [(0, EOS)] * (N - len(live))  # empty rows: scored -inf, never chosen
            rows += [b * N + beam for beam, _ in live]
            next_tokens += [t for _, t in live]
        if all(done):
            break
        scores = torch.tensor(next_scores, device=device)
        index = torch.tensor(rows, device=device)
        steps.keep_rows(index)
        token = torch.tensor(next_tokens, device=device)[:, None]
    return [max(f, key=lambda x: x[0])[1] if f else beams[b][0] for b, f in enumerate(finished)]


# ---------------------------------------------------------------------------- metrics


def edit_distance(a: list, b: list) -> int:
    """Levenshtein distance: insertions, deletions and substitutions, each costing 1."""
    previous = list(range(len(b) + 1))
    for i, x in enumerate(a, start=1):
        current = [i]
        for j, y in enumerate(b, start=1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (x != y)))
        previous = current
    return previous[-1]


@dataclass
class TransductionResult:
    """`charlm eval` on pairs: target loss, and how often and how far the decoded targets miss the references.

    A source listed on several lines (CMUdict's alternate pronunciations) is decoded once and has them all as its
    references: its hypothesis is right if it equals any of them, and its character and token errors are counted
    against the closest one (the protocol of the published G2P figures). `single_reference` holds the same figures
    with each line scored on its own, its hypothesis against that line's target alone."""

    loss: float  # nats per target character (EOS included), teacher-forced, over every line
    exact_match: float  # fraction of sources decoded as one of their references (word accuracy for G2P)
    word_error_rate: float  # 1 - exact_match
    char_error_rate: float  # edit distance to the closest reference, over those references' characters
    token_error_rate: float | None  # the same over whitespace-separated tokens (phoneme error rate for G2P)
    lines: int
    chars: int  # target characters scored by the loss
    split: str = "val"
    file: str = ""
    beam: int = 1
    sources: int = 0  # distinct sources scored (= lines when each has one reference)
    unknown_chars: int = 0  # characters the model never saw in the file scored, replaced (--unknown replace)
    unknown_lines: int = 0  # the file's lines that held one (replaced, or left out with --unknown skip)
    unknown_target_lines: int = 0  # of those, lines whose target held one: the model cannot write it, so never right
    single_reference: dict[str, Any] = field(default_factory=dict)  # the figures line by line
    skipped: list[str] = field(default_factory=list)  # lines left out as data.skip_bad_lines says, in words

    @property
    def bpc(self) -> float:
        return self.loss / math.log(2)

    def to_dict(self) -> dict:
        return {**asdict(self), "bpc": self.bpc}


def error_rates(
    references: list[list[str]], hypotheses: list[str], writable: list[list[bool]] | None = None
) -> dict[str, Any]:
    """Word, character and token error rates of one hypothesis per source against that source's references: right if
    it equals any the model can write (`writable`, default all: a reference whose unseen characters were replaced
    is one it cannot); edits counted against the reference closest in characters (tokens: closest in tokens), the
    shorter one where two are as close (the higher rate: a tie never flatters)."""
    exact = chars = char_errors = tokens = token_errors = 0
    for i, (refs, hyp) in enumerate(zip(references, hypotheses, strict=True)):
        exact += any(hyp == r and (writable is None or writable[i][j]) for j, r in enumerate(refs))
        char_error, ref_chars = min((edit_distance(list(r), list(hyp)), len(r)) for r in refs)
        token_error, ref_tokens = min((edit_distance(r.split(), hyp.split()), len(r.split())) for r in refs)
        chars, char_errors = chars + ref_chars, char_errors + char_error
        tokens, token_errors = tokens + ref_tokens, token_errors + token_error
    has_tokens = any(" " in r for refs in references for r in refs)  # whitespace-separated targets: phonemes, words
    return {
        "exact_match": exact / len(references),
        "word_error_rate": 1 - exact / len(references),
        "char_error_rate": char_errors / max(chars, 1),
        "token_error_rate": token_errors / max(tokens, 1) if has_tokens else None,
    }


def score_pairs(
    model: Models,
    decode: Callable[[list[int]], str],
    pairs: list[Pair],
    options: DecodeOptions,
    batch_size: int = 64,
) -> TransductionResult:
    """Teacher-forced loss and decoded metrics of `pairs`, each distinct source decoded once and scored against all
    of its references; `decode` turns target ids into text."""
    models = members(model)
    device = next(models[0].parameters()).device
    if len(models) == 1:
        total, count = pairs_total(models[0], pairs, device, batch_size)
    else:
        total, count = ensemble_total(models, pairs, device, batch_size)
    return against_references(decode, pairs, total, count, lambda sources: transduce(model, sources, options), options)


class MeanOfMembers(nn.Module):
    """An ensemble as one model for teacher-forced scoring: forward gives the members' mean log-probabilities
    (B, T, V) and the cross-entropy of their renormalisation, the distribution decoding draws from."""

    def __init__(self, models: list[EncoderDecoder]):
        super().__init__()
        self.members = nn.ModuleList(models)

    def forward(
        self, src: torch.Tensor, tgt_in: torch.Tensor, targets: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        mean = torch.stack([torch.log_softmax(m(src, tgt_in)[0].float(), dim=-1) for m in self.members]).mean(0)
        if targets is None:
            return mean, None
        return mean, F.cross_entropy(mean.flatten(0, 1), targets.flatten(), ignore_index=IGNORE)


def ensemble_total(
    models: list[EncoderDecoder], pairs: list[Pair], device: torch.device, batch_size: int
) -> tuple[float, int]:
    """pairs_total of the ensemble's distribution: its summed cross-entropy (nats) over every target character and
    EOS, and how many there were (over the whole vocabulary, as one model is scored)."""
    return pairs_total(MeanOfMembers(models), pairs, device, batch_size)


def source_key(source: list[int], index: int) -> Any:
    """What makes lines one source's references: the same ids, unless unseen characters were replaced in them
    (then the line is a source of its own: charlm.data.pairs.ReplacedSource)."""
    return ("line", index) if isinstance(source, ReplacedSource) else tuple(source)


def against_references(
    decode: Callable[[list[int]], str],
    pairs: list[Pair],
    total: float,
    count: int,
    rewrite: Callable[[list[list[int]]], list[list[int]]],
    options: DecodeOptions,
) -> TransductionResult:
    """The figures of `pairs` from their summed loss (`total` nats over `count` target characters) and `rewrite`,
    which decodes sources: each distinct source once, scored against every line it has."""
    keys = [source_key(source, i) for i, (source, _) in enumerate(pairs)]
    references: dict[Any, list[str]] = {}
    writable: dict[Any, list[bool]] = {}  # False: a target whose unseen characters were replaced, never matched
    first: dict[Any, list[int]] = {}  # each source's ids, to decode it once
    for key, (source, target) in zip(keys, pairs, strict=True):
        references.setdefault(key, []).append(decode(target))
        writable.setdefault(key, []).append(not isinstance(target, ReplacedTarget))
        first.setdefault(key, list(source))
    sources = list(references)
    hypotheses = rewrite([first[key] for key in sources])
    decoded = {key: decode(h) for key, h in zip(sources, hypotheses, strict=True)}
    lines = [[decode(t)] for _, t in pairs], [decoded[key] for key in keys]
    by_line = error_rates(*lines, [[not isinstance(t, ReplacedTarget)] for _, t in pairs])
    return TransductionResult(
        **error_rates(list(references.values()), [decoded[key] for key in sources], list(writable.values())),
        loss=total / count,
        lines=len(pairs),
        chars=count,
        beam=options.beam,
        sources=len(sources),
        single_reference={**by_line, "lines": len(pairs)},
    )
