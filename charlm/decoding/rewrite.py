"""Rewriting sources into targets with an encoder–decoder: batched greedy or sampled decoding and beam search, one
loop for torch modules and an export's graphs alike (charlm/decoding/steps.py); scoring is charlm/evaluation's.

The encoder runs once per batch of sources; the decoder is KV-cached, one new character per step for every row. An
ensemble (several models of one vocabulary and context, given as a list) decodes and is scored on the mean of its
members' log-probabilities, renormalised: the product of their distributions.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from charlm.data.tokenizer import BOS, EOS
from charlm.decoding.options import DecodeOptions
from charlm.decoding.sampling import sample_next, seeded_generator
from charlm.decoding.steps import GraphRuntime, GraphTargetSteps, Models, ModuleTargetSteps, TargetSteps, members

StepsOf = Callable[[list[list[int]], int], TargetSteps]  # (sources, copies: rows per source) -> their target side


@torch.no_grad()
def rewrite(model: Models, sources: list[list[int]], options: DecodeOptions) -> list[list[int]]:
    """The target ids (without BOS/EOS) for every source, in the order given."""
    for m in members(model):
        m.eval()
    room = target_room(members(model)[0].config.block_size)  # an ensemble shares its context
    return rewrite_in_batches(lambda batch, copies: ModuleTargetSteps(model, batch, copies), sources, options, room)


def rewrite_graphs(
    runtime: GraphRuntime, sources: list[list[int]], options: DecodeOptions, block_size: int
) -> list[list[int]]:
    """rewrite() through an export's encoder and decoder-step graphs (onnxruntime): the same decoding."""
    steps_of: StepsOf = lambda batch, copies: GraphTargetSteps(runtime, batch, copies)  # noqa: E731
    return rewrite_in_batches(steps_of, sources, options, target_room(block_size))


def rewrite_in_batches(
    steps_of: StepsOf, sources: list[list[int]], options: DecodeOptions, room: int
) -> list[list[int]]:
    """Every source's target ids, in the order given, decoded options.batch_size sources at a time (greedy, sampled
    or by beam search) through the target side `steps_of` gives; at most `room` characters each."""
    generator = seeded_generator(options.seed)
    limit = min(options.max_new_tokens, room)
    results: dict[int, list[int]] = {}
    order = sorted(range(len(sources)), key=lambda i: len(sources[i]))  # similar lengths together: less padding
    for first in range(0, len(order), options.batch_size):
        chosen = order[first : first + options.batch_size]
        batch = [sources[i] for i in chosen]
        if options.beam > 1:
            outputs = beam_batch(steps_of(batch, options.beam), len(batch), options.beam, limit)
        else:
            outputs = _decode_batch(steps_of(batch, 1), len(batch), options, generator, limit)
        results.update(zip(chosen, outputs, strict=True))
    return [results[i] for i in range(len(sources))]


def target_room(block_size: int) -> int:
    """The most characters a target may have: the start symbol takes the first of the context's positions. A target
    this long ran out of room before its end symbol (it was cut, not finished)."""
    return block_size - 1


def _decode_batch(
    steps: TargetSteps, rows: int, options: DecodeOptions, generator: torch.Generator, limit: int
) -> list[list[int]]:
    token = torch.full((rows, 1), BOS, dtype=torch.long, device=steps.device)  # (B, 1)
    out: list[list[int]] = [[] for _ in range(rows)]
    done = torch.zeros(rows, dtype=torch.bool, device=steps.device)
    for _ in range(limit):
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
    limit = min(options.max_new_tokens, target_room(members(model)[0].config.block_size))
    return beam_batch(ModuleTargetSteps(model, [source], options.beam), 1, options.beam, limit)[0]


def beam_batch(steps: TargetSteps, B: int, N: int, limit: int) -> list[list[int]]:
    """Beam search for a batch of B sources at once, N beams each, through `steps` (each source's N rows together:
    row b·N + k holds beam k of source b).

    A hypothesis ends at EOS; the best is the one with the highest mean log-probability per character (EOS
    included), so short hypotheses are not favoured merely for having fewer terms (length normalisation). A
    source stops once N hypotheses have ended and no live one scores better than the best ended one so far.
    """
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
