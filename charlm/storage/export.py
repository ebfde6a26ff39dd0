"""Exports: a folder anyone can load without unpickling — weights in safetensors, config and vocabulary in JSON, and a
README.md model card. `charlm sample/eval/info DIR` and `charlm.load(DIR)` read it; logits equal the checkpoint's.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from charlm.config.schema import TrainConfig, config_from_dict
from charlm.data.tokenizer import tokenizer_from_json
from charlm.errors import UsageError
from charlm.files import atomic_write
from charlm.storage.checkpoint import Checkpoint
from charlm.version import __version__

WEIGHTS, CONFIG, VOCAB, CARD = "model.safetensors", "config.json", "vocab.json", "README.md"
EXPORT_FORMAT = "charlm-export-1"


def _safetensors() -> Any:
    try:
        import safetensors.torch
    except ImportError:
        raise UsageError(
            'exports need the safetensors package: pip install -e ".[export]" in your charlm checkout '
            "(or pip install safetensors)"
        ) from None
    return safetensors.torch


def is_export(path: Path) -> bool:
    """A folder written by `charlm export` (judged by its weights file; read_export checks the rest)."""
    return path.is_dir() and (path / WEIGHTS).is_file()


def write_export(ckpt: Checkpoint, out_dir: Path, card: str) -> list[Path]:
    """Write the four files (each atomically); returns their paths."""
    st = _safetensors()
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"cannot create export folder {out_dir}: {e.strerror}") from None
    # Clones: a tied head shares the embedding's storage, which safetensors refuses to write twice.
    weights = {k: v.detach().to("cpu").clone().contiguous() for k, v in ckpt.state["model"].items()}
    meta = {"format": EXPORT_FORMAT, "charlm_version": __version__, "step": str(ckpt.step)}
    config: dict[str, Any] = {
        "format": EXPORT_FORMAT,
        "charlm_version": __version__,
        "step": ckpt.step,
        **ckpt.config.to_dict(),
    }
    config["data"]["path"] = data_name(ckpt)  # the file's name: a published model must not carry a home directory
    files = {
        WEIGHTS: st.save(weights, metadata=meta),
        CONFIG: (json.dumps(config, indent=2) + "\n").encode(),
        VOCAB: (ckpt.tokenizer.to_json() + "\n").encode(),
        CARD: card.encode(),
    }
    for name, data in files.items():
        atomic_write(out_dir / name, lambda f, data=data: f.write(data))
    return [out_dir / name for name in files]


def read_export(folder: Path) -> Checkpoint:
    """An export as a Checkpoint (weights, config, vocabulary); JSON and safetensors only, nothing unpickled."""
    st = _safetensors()
    try:
        raw = json.loads((folder / CONFIG).read_text(encoding="utf-8"))
        kind = raw.get("data", {}).get("tokenizer", "char") if isinstance(raw, dict) else "char"
        tokenizer = tokenizer_from_json(kind, (folder / VOCAB).read_text(encoding="utf-8"))
    except (OSError, ValueError, AttributeError) as e:
        raise UsageError(f"export {folder} is damaged: {CONFIG} or {VOCAB} cannot be read ({e})") from None
    if not isinstance(raw, dict) or raw.get("format") != EXPORT_FORMAT:
        raise UsageError(f"{folder / CONFIG} is not a charlm export config (format {EXPORT_FORMAT} expected)")
    step = raw.get("step", 0)
    sections = {k: v for k, v in raw.items() if k in ("data", "model", "train", "sample")}
    try:
        config = config_from_dict(sections, str(folder / CONFIG))
        weights = st.load_file(str(folder / WEIGHTS))
    except UsageError as e:
        raise UsageError(f"export {folder} holds an invalid config: {e}") from None
    except Exception as e:  # safetensors raises its own error types for damaged files
        raise UsageError(f"export {folder} is damaged: {WEIGHTS} cannot be read ({type(e).__name__})") from None
    return Checkpoint(folder, config, tokenizer, {"model": weights, "step": step})


def data_name(ckpt: Checkpoint) -> str:
    """The training data as an export records it: its file (or folder) name, never the path on the trainer's disk."""
    return Path(ckpt.config.data.path).name


def optimizer_name(train: TrainConfig) -> str:
    if train.optimizer == "muon":
        return f"Muon lr {train.muon_lr:g} for the blocks' matrices, AdamW lr {train.lr:g} for the rest"
    return f"AdamW lr {train.lr:g}"


def model_card(ckpt: Checkpoint, params: int, scores: dict[str, float] | None, sample: str, folder: Path) -> str:
    m, t = ckpt.config.model, ckpt.config.train
    data, unit = data_name(ckpt), ckpt.tokenizer.unit
    symbols = "bytes" if unit == "byte" else "characters"
    quality = (
        f"validation pass: **{scores['loss']:.4f} nats/{unit}, {scores['bpc']:.4f} bits/{unit}** "
        f"(perplexity {scores['perplexity']:.3f}) on the validation split of `{data}`"
        if scores
        else f"not measured here: the training corpus `{data}` was not found at export time"
    )
    return f"""# charlm character-level language model

A decoder-only Transformer over {ckpt.tokenizer.vocab_size} {symbols}, trained with charlm on `{data}`.

| | |
|---|---|
| shape | {m.n_layer} layers, {m.n_head} heads, {m.n_embd} wide, context {m.block_size} characters |
| parts | {m.pos_encoding} positions, {m.norm} ({m.norm_position}), {m.activation} feed-forward x{m.ffn_mult:g}, \
{"tied" if m.tie_weights else "untied"} head |
| parameters | {params:,} |
| training | {ckpt.step:,} steps of batch {t.batch_size} x {t.grad_accum}, {optimizer_name(t)} ({t.lr_schedule}) |
| quality | {quality} |

## Use it

```bash
charlm sample {folder} --prompt "JULIET:" --seed 1
charlm eval {folder} --data input.txt
```

```python
import charlm
model = charlm.load("{folder}")
print(model.generate("JULIET:", max_new_tokens=200, seed=1))
```

Files: `{WEIGHTS}` (weights only, safetensors), `{CONFIG}` (the configuration it was trained with),
`{VOCAB}` (the characters, in id order). Loading never unpickles anything.

## A sample (seed 1, temperature {ckpt.config.sample.temperature:g})

```text
{sample}
```
"""


def transducer_card(
    ckpt: Checkpoint, params: int, scores: dict[str, Any] | None, examples: list[tuple[str, str]], folder: Path
) -> str:
    """The model card of an encoder-decoder: its shape, its validation figures, and a few of its rewrites."""
    m, t = ckpt.config.model, ckpt.config.train
    data = data_name(ckpt)
    quality = (
        f"validation split of `{data}`, greedy: **exact match {100 * scores['exact_match']:.2f}%**, character error "
        f"rate {100 * scores['char_error_rate']:.2f}%"
        + (
            f", token error rate {100 * scores['token_error_rate']:.2f}%"
            if scores["token_error_rate"] is not None
            else ""
        )
        + f"; target loss {scores['loss']:.4f} nats/char"
        if scores
        else f"not measured here: the training pairs `{data}` were not found at export time"
    )
    shape = (
        f"{m.n_encoder_layer or m.n_layer} encoder + {m.n_layer} decoder layers, {m.n_head} heads, {m.n_embd} wide, "
        f"context {m.block_size} characters"
    )
    parts = (
        f"{m.pos_encoding} positions, {m.norm} ({m.norm_position}), {m.activation} feed-forward x{m.ffn_mult:g}, "
        f"{'shared' if m.share_embeddings else 'separate'} source/target embeddings, "
        f"{'tied' if m.tie_weights else 'untied'} head"
    )
    rows = "\n".join(f"{source}\t{target}" for source, target in examples) or "(no validation pairs at export time)"
    return f"""# charlm character-level encoder-decoder

An encoder-decoder Transformer rewriting a source string into a target string, over {ckpt.tokenizer.vocab_size}
characters (ids 0, 1, 2: padding, start, end), trained with charlm on the pairs of `{data}`.

| | |
|---|---|
| shape | {shape} |
| parts | {parts} |
| parameters | {params:,} |
| training | {ckpt.step:,} steps of batch {t.batch_size} x {t.grad_accum}, {optimizer_name(t)} ({t.lr_schedule}) |
| quality | {quality} |

## Use it

```bash
charlm sample {folder} --prompt "SOURCE"            # greedy; --beam 5 for beam search
charlm sample {folder} --prompt-file words.txt      # source<TAB>target for every line
```

```python
import charlm
model = charlm.load("{folder}")
print(model.transduce("SOURCE", beam=5))
```

Files: `{WEIGHTS}` (weights only, safetensors), `{CONFIG}` (the configuration it was trained with),
`{VOCAB}` (the characters, in id order). Loading never unpickles anything.

## Some validation sources and what it makes of them (greedy)

```text
{rows}
```
"""


def encoder_card(ckpt: Checkpoint, params: int, scores: dict[str, Any] | None, example: str, folder: Path) -> str:
    """The model card of an encoder: its shape, how well it restores hidden characters, and a filled example."""
    m, t = ckpt.config.model, ckpt.config.train
    data = data_name(ckpt)
    quality = (
        f"validation split of `{data}`: **{100 * scores['accuracy']:.2f}% of hidden characters restored** (15% of "
        f"each window hidden), loss {scores['loss']:.4f} nats per hidden character"
        if scores
        else f"not measured here: the training corpus `{data}` was not found at export time"
    )
    filled = f"\n`ROM_O AND JUL_ET` is filled as `{example}`.\n" if example else ""
    return f"""# charlm character-level encoder

An encoder-only Transformer (BERT's masked-character objective) over {ckpt.tokenizer.vocab_size} characters and a
mask symbol, trained with charlm on `{data}`.

| | |
|---|---|
| shape | {m.n_layer} layers, {m.n_head} heads, {m.n_embd} wide, context {m.block_size} characters |
| training | {ckpt.step:,} steps of batch {t.batch_size} x {t.grad_accum}, {optimizer_name(t)} ({t.lr_schedule}) |
| parameters | {params:,} |
| quality | {quality} |
{filled}
## Use it

```bash
charlm fill {folder} --prompt "ROM_O AND JUL_ET"     # every _ filled at once, with the top candidates
```

```python
import charlm
print(charlm.load("{folder}").fill("ROM_O AND JUL_ET")["text"])
```

Files: `{WEIGHTS}` (weights only, safetensors), `{CONFIG}`, `{VOCAB}`. Loading never unpickles anything.
"""
