"""What commands print for people at the end (scripts use --json instead)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.markup import escape
from rich.table import Table

from charlm.progress import stderr_console, stdout_console

if TYPE_CHECKING:  # only for annotations: `charlm config --keys` must not import torch
    from charlm.config.reference import KeyInfo
    from charlm.evaluation.items import ItemsResult
    from charlm.evaluation.loss import EvalResult
    from charlm.evaluation.masked import MaskedResult
    from charlm.evaluation.transduction import TransductionResult
    from charlm.models.info import ModelInfo
    from charlm.storage.run_state import TrainSummary


def print_train_summary(summary: TrainSummary) -> None:
    """The end-of-training report, for people (scripts use --json)."""
    out = stdout_console()
    s = summary
    out.print(
        f"[bold]done[/bold] ({s.stop_reason}): {s.steps:,} steps, {s.tokens:,} tokens, {s.wall_s:.1f} s wall, "
        f"{s.tokens_per_s:,.0f} tokens/s" + (f", compile {s.compile_s:.1f} s" if s.compile_s else "")
    )
    u = s.unit
    scored = (
        "full validation pass" if s.full_val_whole else f"validation pass over the first {s.full_val_tokens:,} {u}s"
    )
    accuracy = s.best_val_accuracy
    chosen = f"best val accuracy {100 * accuracy:.2f}% (it chose best.pt); " if accuracy is not None else ""
    out.print(
        f"{chosen}best val loss {s.best_val_loss:.4f} nats/{u} (sampled windows); {scored} of best.pt: "
        f"[bold]{s.full_val_loss:.4f} nats/{u}, {s.full_val_bpc:.4f} bits/{u}[/bold]"
    )
    out.print(f"checkpoints in {s.out_dir}: best.pt, last.pt; metrics in {s.out_dir}/metrics.jsonl")


def _what_was_scored(split: str, file: str) -> str:
    return f"all of {file}" if split == "all" else f"{split} split of {file}"


def print_eval_result(result: EvalResult) -> None:
    scored = _what_was_scored(result.split, result.file)
    u = result.unit
    stdout_console().print(
        f"{scored}: loss {result.loss:.4f} nats/{u}, {result.bpc:.4f} bits/{u}, "
        f"perplexity {result.perplexity:.3f}, {result.chars:,} {'characters' if u == 'char' else 'bytes'} scored, "
        f"stride {result.stride}",
        markup=False,
    )


def _count(n: int, noun: str) -> str:
    """'1 line', '2 lines' ("such character" -> "such characters")."""
    return f"{n:,} {noun}" if n == 1 else f"{n:,} {noun}s"


def print_transduction_result(r: TransductionResult) -> None:
    scored = _what_was_scored(r.split, r.file)
    tokens = "" if r.token_error_rate is None else f", token error rate {100 * r.token_error_rate:.2f}%"
    decoding = "greedy" if r.beam == 1 else f"beam {r.beam}"
    counted = _count(r.lines, "line")
    single = ""
    if r.sources and r.sources != r.lines:  # alternates: scored against every reference, the line-by-line beside
        counted = f"{_count(r.sources, 'source')} on {_count(r.lines, 'line')} (any reference counts)"
        single = (
            f"; line by line, one reference each: word error rate {100 * r.single_reference['word_error_rate']:.2f}%"
        )
    for note in r.skipped:
        stderr_console().print(note, markup=False)
    if r.unknown_lines:
        replaced = r.unknown_chars + r.unknown_features
        parts = [_count(n, noun) for n, noun in ((r.unknown_chars, "such character"), (r.unknown_features, "feature"))]
        what = " and ".join(p for p, n in zip(parts, (r.unknown_chars, r.unknown_features), strict=True) if n)
        what = f"{what} replaced" if replaced else "left out"
        stderr_console().print(
            f"{_count(r.unknown_lines, 'line')} of {r.file} with characters the model never saw: {what}", markup=False
        )
    if r.unknown_target_lines and r.unknown_chars:
        stderr_console().print(
            f"{_count(r.unknown_target_lines, 'line')} of {r.file} ha{'s' if r.unknown_target_lines == 1 else 've'} "
            "a target character the model never saw: right only where the model copies it from the source",
            markup=False,
        )
    stdout_console().print(
        f"{scored}: {counted}; target loss {r.loss:.4f} nats/char ({r.bpc:.4f} bits); {decoding}: exact "
        f"match {100 * r.exact_match:.2f}% (word error rate {100 * r.word_error_rate:.2f}%), character error rate "
        f"{100 * r.char_error_rate:.2f}%{tokens}{single}",
        markup=False,
    )


def print_masked_result(r: MaskedResult) -> None:
    scored = _what_was_scored(r.split, r.file)
    stdout_console().print(
        f"{scored}: {r.chars:,} hidden characters (15% of each window, the same every time): restored "
        f"{100 * r.accuracy:.2f}%, loss {r.loss:.4f} nats/char ({r.bpc:.4f} bits)",
        markup=False,
    )


def print_items_result(r: ItemsResult) -> None:
    scored = _what_was_scored(r.split, r.file)
    for note in r.skipped:
        stderr_console().print(note, markup=False)
    stdout_console().print(
        f"{scored}: {r.items:,} items; loss {r.loss:.4f} nats/char, {r.bpc:.4f} bits/char, perplexity "
        f"{r.perplexity:.3f} (each item's end symbol counted as a character: {r.chars:,} scored); mean "
        f"log-likelihood {r.mean_logprob:.3f} nats per item",
        markup=False,
    )


def print_score(result: EvalResult | TransductionResult | MaskedResult | ItemsResult) -> None:
    """What `charlm eval` prints for whichever result the model's family scored."""
    PRINTERS[type(result).__name__](result)


# By class name: this module imports no torch (the result classes do), so that `charlm config` stays fast.
PRINTERS: dict[str, Any] = {
    "EvalResult": print_eval_result,
    "TransductionResult": print_transduction_result,
    "MaskedResult": print_masked_result,
    "ItemsResult": print_items_result,
}


def print_model_info(info: ModelInfo, title: str) -> None:
    table = Table(
        title=title,
        title_justify="left",
        caption_justify="left",
        caption=(
            "d = n_embd, Le/Ld = encoder/decoder layers, T = block_size, V = vocabulary; N = matmul weights = "
            "Le·(attention + feed-forward) + Ld·(2·attention + feed-forward) + d·V (embedding lookups cost no FLOPs)"
            if info.stacks and "encoder" in info.stacks
            else "d = n_embd, L = n_layer, T = block_size, V = vocabulary; N = matmul weights = "
            "L·(attention + feed-forward) + d·V (embedding lookups cost no FLOPs)"
        ),
    )
    table.add_column("component")
    table.add_column("parameters", justify="right")
    table.add_column("formula")
    stacks = info.stacks or {"layer": info.n_layer}
    names = {"layer": ("layer", "n_layer"), "encoder": ("encoder layer", "Le"), "decoder": ("decoder layer", "Ld")}
    for row in info.rows:
        name = f"  per {names[row.stack][0]}: {row.component}" if row.per_layer else row.component
        table.add_row(name, f"{row.params:,}", row.formula)
        stack_rows = [r for r in info.rows if r.per_layer and r.stack == row.stack]
        if row.per_layer and row.stack != "layer" and row is stack_rows[-1]:  # an encoder-decoder's stack ends
            per_layer = sum(r.params for r in stack_rows)
            label, symbol = names[row.stack]
            table.add_row(f"  one {label}", f"{per_layer:,}", "sum of the rows above")
            n = stacks[row.stack]
            table.add_row(f"  all {n} {label}s", f"{per_layer * n:,}", f"{symbol} × (per-layer rows)")
    if list(stacks) == ["layer"]:  # a decoder-only model: the one sum, after every row (as it always was)
        per_layer = sum(r.params for r in info.rows if r.per_layer)
        table.add_row(f"  all {info.n_layer} layers", f"{per_layer * info.n_layer:,}", "n_layer × (per-layer rows)")
    table.add_section()
    table.add_row("[bold]total[/bold]", f"[bold]{info.total_params:,}[/bold]", "sum of the rows (= sum of p.numel())")
    if info.active_params != info.total_params:
        table.add_row("active per token", f"{info.active_params:,}", "total - L·(E - k)·expert")
    table.add_row("training FLOPs per token", f"{info.flops_per_token:,}", info.flops_formula)
    stdout_console().print(table)


def print_config_keys(keys: list[KeyInfo]) -> None:
    """One key per entry: `key = default  (type)`, then its meaning; readable at any terminal width and in a pipe."""
    out = stdout_console()
    for k in keys:
        out.print(f"[bold]{k.key}[/bold] = {escape(k.default)}  [dim]({escape(k.type)})[/dim]")
        out.print(f"    {escape(k.help)}")
    out.print("Set a key with --set section.key=value or in a YAML file (--config); docs/config.md has the same list.")
