"""An ONNX export folder as a charlm Model run by onnxruntime, and the ONNX export itself (charlm.load and
charlm.export call them: charlm/api/entry.py)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from charlm.api.model import Model
from charlm.data.corpus import IGNORE
from charlm.data.pairs import Pair, in_batches, pad_batch
from charlm.data.tokenizer import UnknownPolicy
from charlm.decoding.options import DecodeOptions
from charlm.decoding.rewrite import rewrite_graphs
from charlm.decoding.steps import GraphTextSteps, TextSteps
from charlm.errors import UsageError
from charlm.evaluation.transduction import TransductionResult, against_references
from charlm.storage.loading import load_model_file
from charlm.storage.onnx_export import OnnxExport, Written, is_onnx_export, read_onnx_export
from charlm.storage.onnx_runtime import OnnxForward


class OnnxModel(Model):
    """An ONNX export run by onnxruntime (charlm.storage.onnx_export): generate and evaluate (a decoder), rewrite
    greedily, sampled or by beam search (an encoder-decoder), fill and evaluate (an encoder), with charlm's own
    windowing, sampler, stop strings and scoring around the exported graphs; what needs the torch modules is refused."""

    runtime = "onnxruntime"

    def __init__(self, export: OnnxExport):
        self.onnx = export.runtime
        vocab = export.tokenizer.vocab_size
        module: Any = OnnxForward(export.runtime, export.config.model, vocab)
        super().__init__(module, export.tokenizer, export.config, export.path)

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    def torch_only(self, what: str) -> UsageError:
        return UsageError(
            f"{what} needs the torch model; {self.path} is an ONNX export: use a checkpoint or a safetensors export"
        )

    @contextlib.contextmanager
    def text_steps(self, options: DecodeOptions) -> Iterator[TextSteps]:
        """A decoder export samples as the torch model does, the same loop stepped through its decoder-step graph."""
        self.require("decoder")
        if options.compile or not options.use_cache:
            raise self.torch_only("--compile" if options.compile else "--no-cache")
        yield GraphTextSteps(self.onnx.step, self.config.model)

    def rewriter(self, ensemble: Sequence[Any] = ()) -> Any:
        """An encoder-decoder export rewrites as the torch model does (greedy, sampled or by beam search), the same
        decoding loop stepped through its encoder and decoder-step graphs."""
        self.require("encoder-decoder")
        if ensemble:
            raise self.torch_only("an ensemble (--ensemble)")
        room = self.config.model.block_size
        return lambda ids, options: rewrite_graphs(self.onnx, ids, options, room)

    def pair_scorer(self, beam: int) -> Any:
        """An encoder-decoder export is scored as the torch model is: the teacher-forced loss through the decoder
        graph, targets (greedy or by beam search) through the encoder and decoder-step graphs."""
        return self._score_pairs

    def _score_pairs(self, scored: list[Pair], options: DecodeOptions, batch_size: int) -> TransductionResult:
        total, count = 0.0, 0
        for batch in in_batches(scored, batch_size):
            (src, tgt_in), targets = pad_batch(batch, torch.device("cpu"))
            logits, _ = self.onnx.target_step(tgt_in, 0, None, self.onnx.encode(src))  # (B, T, V), every position
            total += F.cross_entropy(
                logits.flatten(0, 1).float(), targets.flatten(), ignore_index=IGNORE, reduction="sum"
            ).item()
            count += int((targets != IGNORE).sum())

        rewrite = self.rewriter()
        return against_references(
            self.tokenizer.decode, scored, total, count, lambda sources: rewrite(sources, options), options.beam
        )

    def attention(self, prompt: str, unknown: UnknownPolicy = "error") -> torch.Tensor:
        raise self.torch_only("attention maps")

    def transduction_attention(self, source: str, unknown: UnknownPolicy = "error") -> dict[str, Any]:
        raise self.torch_only("attention maps")


def load_onnx(folder: Path, device: str, precision: str) -> OnnxModel | None:
    """charlm.load of an ONNX export folder (None for any other path): float32, on onnxruntime's CPU provider."""
    if not is_onnx_export(folder):
        return None
    if precision != "float32":
        raise UsageError(f"--precision {precision} is for torch models; an ONNX export runs in float32")
    if device not in ("auto", "cpu"):
        raise UsageError(f"--device {device}: an ONNX export runs on onnxruntime's CPU provider; use --device cpu")
    return OnnxModel(read_onnx_export(folder))


def export_onnx(
    checkpoint: str | Path, out_dir: str | Path, web: bool = False, runtime: str | Path | None = None,
    overwrite: bool = False,
) -> Written:  # fmt: skip
    """The ONNX export (charlm.storage.onnx_export), checked against the torch model before it is written: what
    was written, the largest logit difference and the greedy comparison."""
    from charlm.storage.export import check_target
    from charlm.storage.model_card import model_card
    from charlm.storage.onnx_export import ONNX_FILES, write_onnx_export
    from charlm.storage.web_export import WEB_NOTE, check_runtime, write_page

    if runtime is not None and not web:
        raise UsageError("--runtime bundles onnxruntime-web with a web page: add --web")
    out = Path(out_dir)
    check_target(out, overwrite)
    bundled = check_runtime(Path(runtime)) if runtime is not None else None
    ckpt = load_model_file(checkpoint)
    model = Model.from_checkpoint(ckpt, "cpu")
    if web and not model.family.continues_text:
        raise model.family.refuse(model, "a decoder (--web makes a page that continues text)")
    files = ONNX_FILES + ("\n\n" + WEB_NOTE if web else "")
    page = (lambda folder: write_page(folder, bundled)) if web else None
    card = lambda: model_card(model.family.card_facts(model, ckpt.step), out, files)  # noqa: E731  (once the graphs export)
    return write_onnx_export(ckpt, model, model.family, out, card, overwrite, page)
