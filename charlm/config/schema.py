"""Typed configuration: one dataclass per section, each key with its default, help and range; charlm/config/build.py
builds a config from its sources in precedence order and validates it."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

import yaml

from charlm.config.sources import (  # noqa: F401  (re-exported: the config API in one import)
    CONFIG_DIRS,
    Options,
    Setting,
    chain_settings,
    file_settings,
    find_config,
    option_settings,
    parse_set,
    read_yaml_file,
    shipped_config_names,
    shown_path,
    suggestion,
)
from charlm.config.values import MAX_TEMPERATURE

DEFAULT_CONFIG = "cpu"


def documented(default: Any, help: str, **checks: Any) -> Any:
    """A dataclass field with its help text and range checks (ge, gt, le, lt) kept as metadata."""
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata={"help": help, "default": default, **checks})
    return field(default=default, metadata={"help": help, **checks})


Logger = Literal["jsonl", "csv", "tensorboard", "wandb"]


@dataclass
class DataConfig:
    path: str = documented(
        "data/tinyshakespeare.txt",
        "text file, or folder of text files joined in name order, to "
        "train on (downloaded when it is a built-in corpus's path and missing)",
    )
    tokenizer: Literal["char", "byte"] = documented(
        "char", "char: one id per distinct character of a UTF-8 text; byte: ids are byte values (256; any file)"
    )
    val_fraction: float = documented(
        0.1, "fraction of the text held out for validation (after the training part)", gt=0.0, lt=1.0
    )
    val_size: int = documented(0, "exact tokens held out for validation (0 = use data.val_fraction)", ge=0)
    test_fraction: float = documented(
        0.0,
        "last fraction of the text held out for testing (never trained on or used for choosing best.pt)",
        ge=0.0,
        lt=1.0,
    )
    test_size: int = documented(0, "exact tokens held out for testing (0 = use data.test_fraction)", ge=0)
    val_path: str = documented(
        "",
        "a file (same format as data.path) to validate on as it is, instead of a fraction of data.path: picks "
        "best.pt and stops early; characters the training file lacks are refused, or read as the unknown symbol "
        "(data.unknown_dropout) (empty = split data.path)",
    )
    test_path: str = documented(
        "",
        "a file (same format as data.path) held out as the test split, read only by `charlm eval --split test`, "
        "never by training (empty = data.test_fraction/test_size of data.path, if set)",
    )
    format: Literal["text", "pairs", "lines"] = documented(
        "text",
        "text: one stream of characters; pairs: UTF-8 TSV, one source<TAB>target per line (model.arch: "
        "encoder-decoder); lines: one item per line, each its own sequence between start and end symbols (model.arch: "
        "decoder; docs/lines.md); pairs and lines are split by lines after a seeded shuffle (val/test fractions and "
        "sizes count lines; for pairs, sources: a source's lines stay together), empty lines skipped",
    )
    columns: Literal["source-target", "source-features-target", "source-target-features"] = documented(
        "source-target",
        "pairs: the columns of a line. source-features-target is the inflection shared tasks' lemma<TAB>features<TAB>"
        "form, source-target-features UniMorph's lemma<TAB>form<TAB>features; each feature (split at "
        "data.feature_separator) is one input of the encoder, never read as characters (docs/rewriting.md)",
    )
    feature_separator: str = documented(";", "pairs with a features column: what separates one feature from the next")
    hallucinate: int = documented(
        0,
        "pairs: add this many synthetic training lines, each a real one with its stem (the longest stretch source and "
        "target share, 3 characters or more) replaced by random characters in both: small inflection sets "
        "(docs/rewriting.md); validation and test lines are never touched (0 = none)",
        ge=0,
    )
    recombine: int = documented(
        0,
        "pairs: add this many synthetic training lines, each the head of one word joined to the tail of another at a "
        "letters-to-sounds unit both share, cut alike on both sides (the units from an alignment learned from the "
        "training lines): pronunciation lists of a few hundred words (docs/rewriting.md); validation and test lines "
        "are never touched (0 = none)",
        ge=0,
    )
    skip_bad_lines: bool = documented(
        False,
        "pairs: skip lines without the columns of data.columns, with an empty column, too long or holding a reserved "
        "control character (U+0000, U+0002, U+0003); lines: skip items too long for the context or holding one "
        "(else: refuse the file)",
    )
    unknown_dropout: float = documented(
        0.0,
        "pairs: the chance that a character of a training source is read as the unknown symbol (U+001A) instead, "
        "there and in its target alike, so the model learns to read past characters it never saw and to copy them "
        "(decoding puts the source's character back where it writes the symbol); > 0 adds the symbol, which then "
        "stands for unseen characters of data.val_path/test_path, of eval and of --unknown replace (0 = none: such "
        "files are refused)",
        ge=0.0,
        le=0.5,
    )


@dataclass
class ModelConfig:
    arch: Literal["decoder", "encoder-decoder", "encoder"] = documented(
        "decoder",
        "decoder: a GPT continuing text; encoder-decoder: the original Transformer, rewriting a source string into "
        "a target string (data.format: pairs); encoder: BERT-style, restoring hidden characters (charlm fill)",
    )
    n_layer: int = documented(4, "number of Transformer blocks (the decoder's, in an encoder-decoder)", ge=1)
    n_encoder_layer: int = documented(0, "encoder blocks of an encoder-decoder (0 = as many as n_layer)", ge=0)
    cross_attention: bool = documented(
        True, "decoder blocks attend to the encoder's output (false only to show what it carries: then they cannot)"
    )
    share_embeddings: bool = documented(True, "encoder-decoder: source and target characters share one embedding")
    n_head: int = documented(4, "attention heads per block (must divide n_embd)", ge=1)
    n_embd: int = documented(128, "width of the residual stream", ge=1)
    block_size: int = documented(64, "context length in characters", ge=1)
    dropout: float = documented(0.0, "dropout probability in attention, MLP and embeddings", ge=0.0, lt=1.0)
    attention_dropout: float | None = documented(
        None, "dropout of attention weights (null = model.dropout; above 0 a CPU leaves its fused kernel)", ge=0, lt=1
    )
    bias: bool = documented(True, "biases in Linear layers and LayerNorms")
    pos_encoding: Literal["learned", "sinusoidal", "rope", "alibi"] = documented(
        "learned",
        "positions: learned or sinusoidal (absolute, added to embeddings); rope or alibi (relative, in attention)",
    )
    norm: Literal["layernorm", "rmsnorm"] = documented("layernorm", "normalisation layer")
    norm_position: Literal["pre", "post"] = documented(
        "pre", "pre: x + f(norm(x)) (GPT-2); post: norm(x + f(x)) (original paper)"
    )
    activation: Literal["relu", "gelu", "swiglu", "relu2"] = documented(
        "gelu", "feed-forward activation (swiglu uses 2/3 of the hidden width; relu2 is relu(x)^2)"
    )
    ffn_mult: float = documented(4.0, "feed-forward hidden width as a multiple of n_embd", gt=0.0)
    tie_weights: bool = documented(True, "share the output head's weights with the token embedding")
    qkv_bias: bool | None = documented(None, "biases in the Q/K/V projections (null = model.bias)")
    proj_bias: bool | None = documented(None, "bias in attention's output projection W_O (null = model.bias)")
    ffn_bias: bool | None = documented(None, "biases in the feed-forward layers (null = model.bias)")
    head_bias: bool = documented(False, "a bias in the output head's logits (GPT-2 has none)")
    n_experts: int = documented(
        0, "feed-forward experts per block (0 = one dense feed-forward; mixture of experts)", ge=0
    )
    expert_top_k: int = documented(2, "experts each token is routed to, when n_experts > 0", ge=1)
    moe_aux_weight: float = documented(0.01, "weight of the load-balancing loss added while training", ge=0.0)
    qk_norm: bool = documented(False, "RMS-normalise queries and keys per head before the scores (QK-norm)")
    zero_init_proj: bool = documented(
        False, "start W_O and the feed-forward's output projection at zero, so each block begins as the identity"
    )
    token_shift: bool = documented(
        False,
        "each position's embedding and each layer's self-attention input take in the previous position's, scaled "
        "per channel and gated by the position (RWKV's token shift, nanochat's smear)",
    )
    logit_softcap: float = documented(0.0, "cap the output logits smoothly: c * tanh(logits / c) (0 = off)", ge=0.0)
    init: Literal["gpt2", "torch"] = documented(
        "gpt2",
        "initial weights: gpt2 = N(0, 0.02), residual projections scaled by 1/sqrt(2 n_layer), zero biases; torch = "
        "PyTorch's own layer defaults (uniform Linear weights, N(0, 1) embeddings), as the course notebook has them",
    )
    attention: Literal["fused", "explicit"] = documented(
        "fused",
        "fused: torch's scaled_dot_product_attention kernel; explicit: softmax(QKᵀ/√d_head + mask) V "
        "written out (same results, slower; can return the weights)",
    )


@dataclass
class TrainConfig:
    batch_size: int = documented(32, "windows per micro-batch", ge=1)
    grad_accum: int = documented(1, "micro-batches accumulated per optimizer step", ge=1)
    max_steps: int = documented(5000, "optimizer steps at most (0 = no step limit)", ge=0)
    max_seconds: float = documented(0.0, "wall-clock budget for training in seconds, per invocation (0 = none)", ge=0.0)
    optimizer: Literal["adamw", "muon"] = documented(
        "adamw",
        "adamw: AdamW for every parameter; muon: torch.optim.Muon (momentum orthogonalised by Newton-Schulz "
        "steps) for the blocks' weight matrices, AdamW for embeddings, head, norms and biases",
    )
    lr: float = documented(1e-3, "peak AdamW learning rate (the schedule's reference: other lrs scale with it)", gt=0.0)
    embed_lr: float | None = documented(
        None, "peak AdamW lr of the token and position tables (null = train.lr)", gt=0.0
    )
    head_lr: float | None = documented(None, "peak AdamW lr of an untied output head (null = train.lr)", gt=0.0)
    muon_lr: float = documented(0.02, "peak Muon learning rate (train.optimizer: muon)", gt=0.0)
    muon_momentum: float = documented(0.95, "Muon momentum (Nesterov)", ge=0.0, lt=1.0)
    muon_weight_decay: float = documented(0.0, "Muon's decoupled weight decay", ge=0.0)
    muon_ns_steps: int = documented(5, "Newton-Schulz iterations per Muon step", ge=1)
    muon_adjust_lr: Literal["original", "match_rms_adamw"] = documented(
        "original",
        "Muon's per-shape lr scaling: original (sqrt(max(1, rows/cols)), Keller Jordan's) or "
        "match_rms_adamw (0.2 sqrt(max(rows, cols)): AdamW-sized updates, Moonshot's)",
    )
    min_lr: float = documented(
        1e-5,
        "the floor of every schedule: cosine, linear and wsd decay end here, the plateau rule never goes below it",
        ge=0.0,
    )
    weight_decay: float = documented(0.1, "AdamW weight decay (on the parameters train.decay says)", ge=0.0)
    decay: Literal["matrices", "all"] = documented(
        "matrices",
        "which parameters weight decay applies to: matrices (not biases, norms; GPT-2) or all (torch's "
        "AdamW used plainly, as the course notebook does)",
    )
    beta1: float = documented(0.9, "AdamW beta1", ge=0.0, lt=1.0)
    beta2: float = documented(0.99, "AdamW beta2", ge=0.0, lt=1.0)
    warmup_steps: int = documented(0, "linear learning-rate warmup from 0 over this many steps", ge=0)
    lr_schedule: Literal["plateau", "cosine", "linear", "wsd"] = documented(
        "plateau",
        "after warmup: plateau = ReduceLROnPlateau on validation loss; cosine or linear = decay to min_lr "
        "over the run's budget (max_steps or max_seconds, whichever is nearer); wsd = the peak held, then a "
        "linear decay to min_lr over the budget's last train.warmdown (warmup-stable-decay, Hu et al. 2024)",
    )
    warmdown: float = documented(
        0.4, "wsd: the share of the budget, at its end, over which the lr decays to min_lr", gt=0.0, le=1.0
    )
    grad_clip: float = documented(1.0, "clip the gradient norm to this value (0 = no clipping)", ge=0.0)
    label_smoothing: float = documented(
        0.0,
        "training targets keep 1 - e of their weight and spread e over the vocabulary (Szegedy et al. 2016); "
        "the step loss is this smoothed objective, while evaluated losses (train_loss, val_loss, the full "
        "validation pass) and best.pt's choice stay plain cross-entropy (0 = off)",
        ge=0.0,
        lt=1.0,
    )
    ema_decay: float = documented(
        0.0,
        "an exponential moving average of the weights (0 = off; 0.999 averages about the last 1,000 steps): "
        "evaluations score it and best.pt holds it; last.pt keeps it beside the training weights for --resume",
        ge=0.0,
        lt=1.0,
    )
    eval_interval: int = documented(250, "evaluate every this many optimizer steps", ge=1)
    eval_windows: int = documented(128, "windows scored per split at each evaluation (pairs and lines: lines)", ge=1)
    eval_sampling: Literal["fixed", "random"] = documented(
        "fixed",
        "fixed: the same windows at every evaluation (a low-noise signal); random: fresh random windows "
        "each time (the course notebook's estimate; seeded by train.seed and the step)",
    )
    eval_at_start: bool = documented(False, "also evaluate before the first step (step 0)")
    final_eval_tokens: int = documented(
        1_000_000,
        "the end-of-run validation pass scores at most this many tokens from the start of the validation "
        "split, so big corpora end quickly (0 = the whole split; `charlm eval` always scores all of it)",
        ge=0,
    )
    plateau_factor: float = documented(0.5, "ReduceLROnPlateau: multiply the lr by this at a stall", gt=0.0, lt=1.0)
    plateau_patience: int = documented(3, "ReduceLROnPlateau: evaluations with no new best before the lr drops", ge=0)
    early_stop_patience: int = documented(0, "stop after this many evaluations without improvement (0 = never)", ge=0)
    best_by: Literal["loss", "accuracy"] = documented(
        "loss",
        "what picks best.pt and counts for early stopping: the validation loss, or (encoder-decoder) the exact-match "
        "accuracy of greedy decoding on the validation lines scored (train.eval_windows of them), the shared tasks' "
        "metric; each evaluation then decodes them",
    )
    seed: int = documented(1337, "seed for Python, torch and the batch sampler", ge=0)
    device: str = documented("auto", "auto (cuda, then mps, then cpu), cpu, cuda, cuda:N or mps")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = documented(
        "auto",
        "autocast dtype: auto = bfloat16 on CUDA where supported, else float16; on CPUs with AMX-BF16, bfloat16 "
        "for models wide enough to gain (n_embd >= 384), with AVX-512 BF16 from n_embd 192, or 128 with batch x "
        "context x n_embd >= 0.5M (from 384 when float32 runs on oneDNN, train.cpu_linear); float32 elsewhere",
    )
    compile: Literal["auto", "true", "false"] = documented("auto", "torch.compile: auto = on CUDA only; true; false")
    cpu_linear: Literal["auto", "onednn", "torch"] = documented(
        "auto",
        "float32 linear layers on a CPU: onednn = oneDNN's kernels (the same float32 arithmetic, faster where "
        "torch's default MKL takes a slow path: AMD; docs/benchmarks.md); torch = torch's default; auto = onednn on "
        "x86-64 CPUs whose vendor is known and not Intel",
    )
    loggers: list[Logger] = documented(
        ["jsonl"],
        "where figures go: jsonl (OUT_DIR/metrics.jsonl, steps.jsonl, summary.json; always on), csv "
        "(OUT_DIR/metrics.csv), tensorboard (OUT_DIR/tensorboard; the tensorboard extra), wandb (the wandb extra; "
        "WANDB_MODE=offline honoured); e.g. --set 'train.loggers=[jsonl,csv]'",
    )
    log_interval: int = documented(
        50, "log the training loss, lr and tokens/s every this many steps (0 = only with evaluations)", ge=0
    )
    wandb_project: str = documented("charlm", "the Weights & Biases project of the wandb logger")
    tensorboard: bool = documented(False, "same as adding tensorboard to train.loggers (kept for older configs)")


@dataclass
class SampleConfig:
    temperature: float = documented(0.8, "softmax temperature (0 = greedy)", ge=0.0, le=MAX_TEMPERATURE)
    top_k: int | None = documented(None, "keep only the k most likely characters (null = all)", ge=1)
    top_p: float = documented(1.0, "nucleus sampling: smallest set reaching this probability (1 = all)", gt=0.0, le=1.0)
    max_new_tokens: int = documented(500, "characters to generate", ge=0)


@dataclass
class Config:
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    sample: SampleConfig = field(default_factory=SampleConfig)

    def to_dict(self) -> dict[str, dict[str, Any]]:
        return dataclasses.asdict(self)

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    def flat(self) -> dict[str, Any]:
        """Every key as `section.key` -> value."""
        return {f"{section}.{key}": value for section, body in self.to_dict().items() for key, value in body.items()}


SECTIONS: dict[str, type] = {"data": DataConfig, "model": ModelConfig, "train": TrainConfig, "sample": SampleConfig}
SECTION_KEYS = {name: [f.name for f in dataclasses.fields(kind)] for name, kind in SECTIONS.items()}
