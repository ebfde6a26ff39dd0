"""Scoring an encoder–decoder's pairs: the teacher-forced loss of targets (one model, or an ensemble's renormalised
mean), and the figures of decoded targets against their references (exact match, character and token error rates)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from charlm.data.corpus import IGNORE
from charlm.data.pairs import Pair, ReplacedSource, ReplacedTarget, in_batches, pad_batch
from charlm.data.tokenizer import restore_unknown
from charlm.evaluation.loss import InNats, summed_loss
from charlm.models.encoder_decoder import EncoderDecoder


@torch.no_grad()
def pairs_total(
    model: nn.Module,
    pairs: list[Pair],
    device: torch.device,
    batch_size: int = 64,
    amp_dtype: torch.dtype | None = None,
) -> tuple[float, int]:
    """Summed cross-entropy (nats) over every target character and EOS, and how many there were."""
    was_training = model.training
    model.eval()
    batches = (pad_batch(batch, device) for batch in in_batches(pairs, batch_size))
    total, count = summed_loss(model, batches, device, amp_dtype)
    model.train(was_training)
    return total, count


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
class TransductionResult(InNats):
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
    unknown_target_lines: int = 0  # of those, lines whose target held one: right only where the model copies it
    unknown_features: int = 0  # a features column's features the model never saw, replaced as unseen characters are
    single_reference: dict[str, Any] = field(default_factory=dict)  # the figures line by line
    skipped: list[str] = field(default_factory=list)  # lines left out as data.skip_bad_lines says, in words

    def to_dict(self) -> dict:
        return {**asdict(self), "bpc": self.bpc}


def reference_text(target: list[int], decode: Callable[[list[int]], str]) -> str:
    """A reference as its file has it: a replaced target's own text, else its ids decoded."""
    return target.text if isinstance(target, ReplacedTarget) else decode(target)


def error_rates(references: list[list[str]], hypotheses: list[str]) -> dict[str, Any]:
    """Word, character and token error rates of one hypothesis per source against that source's references: right if
    it equals any; edits counted against the reference closest in characters (tokens: closest in tokens), the
    shorter one where two are as close (the higher rate: a tie never flatters)."""
    exact = chars = char_errors = tokens = token_errors = 0
    for refs, hyp in zip(references, hypotheses, strict=True):
        exact += hyp in refs
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


class BySource:
    """A file's lines grouped as scoring groups them: each distinct source's ids (decoded once), its references as
    the file has them, and the characters a replaced source lost, which its written unknown symbols give back."""

    def __init__(self, pairs: list[Pair], decode: Callable[[list[int]], str]):
        self.decode = decode
        self.references: dict[Any, list[str]] = {}
        self.ids: dict[Any, list[int]] = {}
        self.unseen: dict[Any, str] = {}
        for index, (source, target) in enumerate(pairs):
            key = source_key(source, index)
            self.references.setdefault(key, []).append(reference_text(target, decode))
            self.ids.setdefault(key, list(source))
            self.unseen.setdefault(key, source.unseen if isinstance(source, ReplacedSource) else "")

    def written(self, keys: list[Any], hypotheses: list[list[int]]) -> list[str]:
        """What the model wrote for each of `keys`, its copies of unseen characters put back."""
        return [restore_unknown(self.decode(h), self.unseen[key]) for key, h in zip(keys, hypotheses, strict=True)]


def against_references(
    decode: Callable[[list[int]], str],
    pairs: list[Pair],
    total: float,
    count: int,
    rewrite: Callable[[list[list[int]]], list[list[int]]],
    beam: int = 1,
) -> TransductionResult:
    """The figures of `pairs` from their summed loss (`total` nats over `count` target characters) and `rewrite`,
    which decodes sources: each distinct source once, scored against every line it has."""
    keys = [source_key(source, i) for i, (source, _) in enumerate(pairs)]
    grouped = BySource(pairs, decode)
    sources = list(grouped.references)
    decoded = dict(zip(sources, grouped.written(sources, rewrite([grouped.ids[key] for key in sources])), strict=True))
    by_line = error_rates([[reference_text(t, decode)] for _, t in pairs], [decoded[key] for key in keys])
    return TransductionResult(
        **error_rates(list(grouped.references.values()), [decoded[key] for key in sources]),
        loss=total / count,
        lines=len(pairs),
        chars=count,
        beam=beam,
        sources=len(sources),
        single_reference={**by_line, "lines": len(pairs)},
    )


def score_pairs(
    models: list[EncoderDecoder],
    decode: Callable[[list[int]], str],
    pairs: list[Pair],
    rewrite: Callable[[list[list[int]]], list[list[int]]],
    beam: int = 1,
    batch_size: int = 64,
) -> TransductionResult:
    """Teacher-forced loss (one model, or an ensemble's members) and decoded metrics of `pairs`, each distinct source
    decoded once by `rewrite` and scored against all of its references; `decode` turns target ids into text."""
    device = next(models[0].parameters()).device
    if len(models) == 1:
        total, count = pairs_total(models[0], pairs, device, batch_size)
    else:
        total, count = ensemble_total(models, pairs, device, batch_size)
    return against_references(decode, pairs, total, count, rewrite, beam)
