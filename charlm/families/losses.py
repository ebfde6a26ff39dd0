"""The periodic estimate a run logs at each evaluation: the same fixed windows (or the first lines of pairs) of each
split every time, so the plateau rule sees signal; each DDP rank scores its share and the sums are added up."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from charlm.config.schema import Config
from charlm.data.corpus import Corpus, fixed_windows
from charlm.data.pairs import PairCorpus
from charlm.decoding.options import DecodeOptions
from charlm.decoding.rewrite import rewrite
from charlm.evaluation.transduction import BySource, pairs_total
from charlm.hardware.distributed import Dist
from charlm.models.encoder_decoder import EncoderDecoder

# (model, ids, window starts, device, autocast dtype) -> (summed loss, tokens scored)
WindowScorer = Callable[[nn.Module, torch.Tensor, torch.Tensor, torch.device, "torch.dtype | None"], tuple[float, int]]


class RankShare:
    """Sums every rank's share of a score into one mean."""

    def __init__(self, device: torch.device, dist: Dist):
        self.device, self.dist = device, dist

    def mean(self, total: float, count: int) -> float:
        both = self.dist.sum_(torch.tensor([total, float(count)], dtype=torch.float64, device=self.device))
        return (both[0] / both[1]).item()

    def accuracy(self, model: nn.Module) -> float | None:
        """The validation lines' exact-match share where they are decoded (pairs: PairLosses); None for windows and
        items, which score losses alone (the config allows train.best_by accuracy only for pairs)."""
        return None


class WindowLosses(RankShare):
    """Text: train.eval_windows windows of each split, fixed (or drawn afresh from the seed and the step when
    train.eval_sampling is random), scored by the family's window scorer."""

    def __init__(
        self,
        config: Config,
        corpus: Corpus,
        device: torch.device,
        amp: torch.dtype | None,
        dist: Dist,
        score: WindowScorer,
    ):
        super().__init__(device, dist)
        self.config, self.corpus, self.amp, self.score = config, corpus, amp, score
        T, n, seed = config.model.block_size, config.train.eval_windows, config.train.seed
        self.val_starts = fixed_windows(corpus.val, T, n, seed=seed + 1)
        self.train_starts = fixed_windows(corpus.train, T, n, seed=seed + 2)

    def losses(self, model: nn.Module, step: int) -> tuple[float, float]:
        """(train, validation) mean loss per token at this step."""
        val_starts, train_starts = self.val_starts, self.train_starts
        if self.config.train.eval_sampling == "random":  # fresh windows from the seed and the step: a resume draws
            T, n, seed = self.config.model.block_size, self.config.train.eval_windows, self.config.train.seed  # alike
            val_starts = fixed_windows(self.corpus.val, T, n, seed=seed + 3 + 2 * step)
            train_starts = fixed_windows(self.corpus.train, T, n, seed=seed + 4 + 2 * step)
        return self._loss(model, self.corpus.train, train_starts), self._loss(model, self.corpus.val, val_starts)

    def _loss(self, model: nn.Module, ids: torch.Tensor, starts: torch.Tensor) -> float:
        mine = starts[self.dist.rank :: self.dist.world_size]
        return self.mean(*self.score(model, ids, mine, self.device, self.amp))


class PairLosses(RankShare):
    """Pairs: the first train.eval_windows lines of each (shuffled) split, their target characters; with
    train.best_by accuracy, how many of the validation lines' sources greedy decoding gets right."""

    def __init__(self, config: Config, corpus: PairCorpus, device: torch.device, amp: torch.dtype | None, dist: Dist):
        super().__init__(device, dist)
        n = config.train.eval_windows
        self.train, self.val, self.amp = corpus.train[:n], corpus.val[:n], amp
        self.decode = corpus.tokenizer.decode

    def losses(self, model: nn.Module, step: int) -> tuple[float, float]:
        return self._loss(model, self.train), self._loss(model, self.val)

    def _loss(self, model: nn.Module, pairs: list) -> float:
        mine = pairs[self.dist.rank :: self.dist.world_size]
        return self.mean(*pairs_total(model, mine, self.device, amp_dtype=self.amp))

    def accuracy(self, model: nn.Module) -> float:
        """The share of the validation lines' distinct sources whose greedy target is one of their references, each
        rank decoding its share of the sources; scored as `charlm eval` scores them (a source with unseen characters
        on its own, what the model copies put back, a replaced reference as its file has it)."""
        if not isinstance(model, EncoderDecoder):
            raise TypeError(f"pairs are decoded by an EncoderDecoder, not {type(model).__name__}")
        grouped = BySource(self.val, self.decode)
        keys = list(grouped.references)[self.dist.rank :: self.dist.world_size]
        options = DecodeOptions(temperature=0.0, max_new_tokens=model.config.block_size, batch_size=64)
        was_training = model.training
        try:
            with torch.inference_mode():
                hypotheses = rewrite(model, [grouped.ids[key] for key in keys], options)
        finally:
            model.train(was_training)
        written = grouped.written(keys, hypotheses)
        right = sum(text in grouped.references[key] for text, key in zip(written, keys, strict=True))
        return self.mean(float(right), len(keys))
