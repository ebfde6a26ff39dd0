"""How a training run scores itself: the periodic estimate (fixed windows or lines, shared out over DDP ranks) and
the final validation pass of best.pt that its summary reports."""

from __future__ import annotations

import torch
from torch import nn

from charlm.config.schema import Config
from charlm.data.corpus import Corpus, fixed_windows
from charlm.data.pairs import Pair, PairCorpus, pairs_total
from charlm.evaluation.loss import EvalResult, full_pass, windows_total
from charlm.hardware.distributed import Dist
from charlm.models.encoder import EncoderOnly, all_windows, masked_score


class PeriodicEval:
    """The train and validation losses of every evaluation: each rank scores its share, the sums are added up."""

    def __init__(
        self, config: Config, corpus: Corpus | PairCorpus, device: torch.device, amp: torch.dtype | None, dist: Dist
    ):
        self.config, self.corpus, self.device, self.amp, self.dist = config, corpus, device, amp, dist
        if isinstance(corpus, Corpus):  # fixed windows: every evaluation scores the same text, so the plateau rule
            T, n, seed = config.model.block_size, config.train.eval_windows, config.train.seed  # sees signal
            self.val_starts = fixed_windows(corpus.val, T, n, seed=seed + 1)
            self.train_starts = fixed_windows(corpus.train, T, n, seed=seed + 2)

    def losses(self, model: nn.Module, step: int) -> tuple[float, float]:
        """(train, validation) mean loss per token at this step."""
        n = self.config.train.eval_windows
        if isinstance(self.corpus, PairCorpus):  # the first eval_windows lines of each (shuffled) split
            return self._pairs_loss(model, self.corpus.train[:n]), self._pairs_loss(model, self.corpus.val[:n])
        val_starts, train_starts = self.val_starts, self.train_starts
        if self.config.train.eval_sampling == "random":  # fresh windows from the seed and the step: a resume draws
            T, seed = self.config.model.block_size, self.config.train.seed  # the same
            val_starts = fixed_windows(self.corpus.val, T, n, seed=seed + 3 + 2 * step)
            train_starts = fixed_windows(self.corpus.train, T, n, seed=seed + 4 + 2 * step)
        return self._windows_loss(model, self.corpus.train, train_starts), self._windows_loss(
            model, self.corpus.val, val_starts
        )

    def _windows_loss(self, model: nn.Module, ids: torch.Tensor, starts: torch.Tensor) -> float:
        mine = starts[self.dist.rank :: self.dist.world_size]
        if isinstance(model, EncoderOnly):  # the loss of restoring hidden characters (hidden alike each time)
            total, _, count = masked_score(model, ids, mine, self.device, amp_dtype=self.amp)
        else:
            T = self.config.model.block_size
            total, count = windows_total(model, ids, mine, T, self.device, amp_dtype=self.amp)
        return self._mean(total, count)

    def _pairs_loss(self, model: nn.Module, pairs: list[Pair]) -> float:
        mine = pairs[self.dist.rank :: self.dist.world_size]
        return self._mean(*pairs_total(model, mine, self.device, amp_dtype=self.amp))

    def _mean(self, total: float, count: int) -> float:
        both = self.dist.sum_(torch.tensor([total, float(count)], dtype=torch.float64, device=self.device))
        return (both[0] / both[1]).item()


def final_pass(
    model: nn.Module, corpus: Corpus | PairCorpus, config: Config, device: torch.device, amp: torch.dtype | None
) -> tuple[EvalResult, bool]:
    """The validation split scored whole (up to train.final_eval_tokens on big corpora), and whether it was whole."""
    if isinstance(corpus, PairCorpus):  # every validation line's target characters
        total, count = pairs_total(model, corpus.val, device, amp_dtype=amp)
        return EvalResult(total / count, count, "val", config.data.path), True
    limit = config.train.final_eval_tokens
    val = corpus.val[: limit + 1] if limit else corpus.val
    whole = len(val) == len(corpus.val)
    if isinstance(model, EncoderOnly):  # every whole window of the split, its characters hidden alike
        total, _, count = masked_score(model, val, all_windows(val, config.model.block_size), device)
        return EvalResult(total / max(count, 1), count, "val", config.data.path), whole
    return full_pass(model, val, config.model.block_size, device, amp_dtype=amp), whole
