"""What the command line does with a lines model (data.format lines): `charlm sample`'s whole items, `--novel`, and
`charlm score`, which gives each line of a file its log-likelihood so that candidates can be ranked. Parsing and
messages only; registered on the app in charlm/cli/app.py."""

from __future__ import annotations

import sys
from typing import Annotated, Any, Optional

import typer

from charlm.cli.support import (
    CHECKPOINT_HELP,
    DeviceOption,
    Unknown,
    check_replacement,
    checkpoint_path,
    needs_torch,
    print_json,
    write_flushed,
)
from charlm.errors import UsageError
from charlm.progress import stderr_console


def print_items(model: Any, prompt: str, options: Any, novel: bool, json_out: bool, stream: bool, unknown: Any,
                replace_with: str | None) -> None:  # fmt: skip
    """`charlm sample` on a lines model: one item per line (each ended by the model's end symbol), or one JSON
    object; with --novel only the items that are not training items, and the share that were new on stderr."""
    if stream and not novel and not json_out and options.num_samples == 1:
        prefix = model.encode_prompt(prompt, unknown, replace_with)
        write_flushed(model.tokenizer.decode(prefix))
        model.sample(prefix, options, on_text=write_flushed)
        sys.stdout.write("\n")
        return
    from charlm.families.lines import draw_items

    result = draw_items(model, prompt, options, novel, unknown, replace_with)
    if json_out:
        return print_json(result)
    sys.stdout.writelines(row["text"] + "\n" for row in result["items"])
    capped = sum(row["ended"] == "length" for row in result["items"])
    notes = [f"{capped} reached the length cap before the end symbol"] if capped else []
    if novel:
        seen = result["sampled"] - result["new"]
        left_out = f"{seen} were training items, left out" if seen else "none was a training item"
        notes.insert(
            0, f"{result['new']} of {result['sampled']} items are new ({100 * result['new_share']:.0f}%); {left_out}"
        )
    if notes:
        stderr_console().print("; ".join(notes), markup=False)


def score(
    file: Annotated[
        str, typer.Argument(help="UTF-8 file with one item per line (empty lines skipped); - reads standard input.")
    ],
    checkpoint: Annotated[Optional[str], typer.Argument(help=CHECKPOINT_HELP, show_default=False)] = None,
    sort: Annotated[
        bool, typer.Option("--sort", help="Most likely item first (by log-likelihood); default: the file's order.")
    ] = False,
    unknown: Annotated[
        Unknown, typer.Option(help="Characters the model never saw: skip leaves out the lines that hold them.")
    ] = Unknown.error,
    replace_with: Annotated[
        Optional[str], typer.Option(help="Character used by --unknown replace. Default: space.")
    ] = None,
    device: DeviceOption = "auto",
    batch_size: Annotated[int, typer.Option(min=1, help="Items per forward pass.")] = 256,
    json_out: Annotated[
        bool,
        typer.Option(
            "--json",
            help='Print one JSON object: loss, chars, items, mean_logprob and "scores": [{item, logprob, chars, '
            "per_char}].",
        ),
    ] = False,
) -> None:
    """Score each line of a file as one item of a lines model (data.format lines), to rank candidates.

    Prints log-likelihood<TAB>nats per character<TAB>item for every line (the end symbol counted as a character),
    then the file's loss per character and mean log-likelihood on stderr.
    """
    check_replacement(replace_with)
    needs_torch()
    from charlm.api.model import load
    from charlm.families.lines import read_candidates

    model = load(checkpoint_path(checkpoint), device)  # a bad checkpoint before a bad file
    model.family.as_lines(model)  # another family is refused in one line
    text, where = read_candidates(file)
    result = model.score_items(text, where, unknown=unknown.value, replace_with=replace_with, batch_size=batch_size)
    if sort:
        result.scores.sort(key=lambda s: -s.logprob)
    if json_out:
        return print_json(result.to_dict())
    sys.stdout.writelines(f"{s.logprob:.4f}\t{s.per_char:.4f}\t{s.item}\n" for s in result.scores)
    stderr_console().print(
        f"{result.items:,} items of {where}: loss {result.loss:.4f} nats/char (end symbol counted), "
        f"{result.bpc:.4f} bits/char; mean log-likelihood {result.mean_logprob:.3f} nats per item",
        markup=False,
    )


def refuse_novel(model: Any) -> None:
    raise UsageError(
        f"--novel compares whole items with a list's training items; {model.path} is {model.family.noun} model "
        "(train one with data.format lines)"
    )
