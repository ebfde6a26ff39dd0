"""The parts charlm.training.run builds a run from, one job each: the corpus, the model, and the trainer's start."""

from __future__ import annotations

from pathlib import Path

import torch

from charlm.config.schema import Config
from charlm.data.corpus import Corpus, same_content
from charlm.data.lines import LineCorpus
from charlm.data.pairs import PairCorpus
from charlm.data.prepare import data_bytes
from charlm.errors import UsageError
from charlm.families.registry import AnyModel, build_model, family_for
from charlm.hardware.device import out_of_memory, precision_words
from charlm.hardware.distributed import Dist
from charlm.models.linear import linear_words
from charlm.progress import TrainReporter
from charlm.storage.checkpoint import Checkpoint
from charlm.training.finetune import finetune_tokenizer, init_model
from charlm.training.loop import Trainer


def run_corpus(
    config: Config, ckpt: Checkpoint | None, source: Checkpoint | None, extend_vocab: bool, reporter: TrainReporter
) -> Corpus | PairCorpus | LineCorpus:
    """The prepared corpus in the run's data.format, read with the resumed run's or the fine-tuned model's
    characters where there is one, and checked: long enough for a window, and no held-out file the training file."""
    # Every rank asks for the prepared corpus; a lock lets the first prepare it while the others wait, then map it.
    family = family_for(config)
    tokenizer, hint = None, None
    if ckpt is not None:
        tokenizer, hint = ckpt.tokenizer, f"a resumed run trains on {family.data_noun} made of its own characters"
    elif source is not None:  # fine-tuning (a decoder or an encoder of text: other families are refused before)
        tokenizer = finetune_tokenizer(source, config.data.path, extend_vocab, reporter.info)
        hint = f"the model of {source.path} has never seen them; add --extend-vocab to give them new embedding rows"
    corpus = family.corpus(config, tokenizer, reporter.info, hint)
    corpus.check_windows(config.model.block_size, config.data.path)
    for split, given in (("validation", config.data.val_path), ("test", config.data.test_path)):
        if given and same_content(given, config.data.path):
            reporter.warn(
                f"the {split} file {given} is the training file itself: its figures will measure what the model "
                "memorised, not how it does on text it never saw"
            )
    return corpus


def run_model(
    config: Config,
    ckpt: Checkpoint | None,
    source: Checkpoint | None,
    vocab_size: int,
    device: torch.device,
    reporter: TrainReporter,
) -> AnyModel:
    """The resumed run's model, the fine-tuned source's, or a fresh one; a model too big for the device is a usage
    error that names the settings to shrink, not a traceback."""
    try:
        if ckpt is not None:
            return ckpt.build_model(device)
        if source is not None:
            model = init_model(source, config, vocab_size, device)
            reporter.info(f"starting from the weights of {source.path} (fresh optimizer and schedule)")
            return model
        return build_model(config.model, vocab_size).to(device)
    except RuntimeError as e:
        if not out_of_memory(e):
            raise
        m = config.model
        raise UsageError(
            f"not enough memory on {device} for a model of {m.n_layer} layers x {m.n_embd} wide: choose a smaller "
            "model.n_layer or model.n_embd"
        ) from None


def start_from_checkpoint(
    trainer: Trainer, ckpt: Checkpoint | None, config: Config, out_dir: Path, reporter: TrainReporter
) -> None:
    """A resumed run's state restored, with a warning when its corpus changed size since; the corpus's size recorded
    either way, for the next resume to compare."""
    size = data_bytes(config.data.path)
    if ckpt:
        trainer.resume(*ckpt.resume_state(), ckpt.path)
        reporter.info(f"resuming {out_dir / 'last.pt'} at step {trainer.state.step}")
        if trainer.state.data_bytes and trainer.state.data_bytes != size:  # same characters, or it was refused above
            reporter.warn(
                f"{config.data.path} has changed since this run last started ({trainer.state.data_bytes:,} bytes, "
                f"now {size:,}): training goes on with it as it is now, and its validation figures are not comparable "
                "with the earlier ones"
            )
    trainer.state.data_bytes = size


def describe_setup(trainer: Trainer, config: Config, device: torch.device, dist: Dist, reporter: TrainReporter) -> None:
    """The lines a run opens with: its schedule, precision, CPU linear layers and, under DDP, its processes."""
    reporter.info(trainer.schedule.describe())
    reporter.info(f"precision: {precision_words(trainer.amp_dtype, config.train.dtype, device)}")
    if device.type == "cpu" and trainer.amp_dtype is None:  # under autocast the precision line says it all
        compiled = trainer.forward is not trainer.uncompiled
        reporter.info(f"linear layers: {linear_words(trainer.onednn, config.train.cpu_linear, compiled)}")
    if dist.active:
        reporter.info(
            f"DDP: {dist.world_size} processes ({dist.backend}), global batch {trainer.state.global_batch} windows "
            f"({config.train.batch_size} per rank x {config.train.grad_accum} accumulation)"
        )
