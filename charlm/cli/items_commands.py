"""What the command line does with a lines model (data.format lines): `charlm sample`'s whole items, how many were
new, `--novel`, and `charlm score`, which gives each line of a file its log-likelihood so that candidates can be
ranked. Parsing and messages only; registered on the app in charlm/cli/app.py."""

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
from charlm.errors import UsageError, WorkError
from charlm.progress import stderr_console


def print_items(model: Any, prompt: str, options: Any, novel: bool, json_out: bool, stream: bool, unknown: Any,
                replace_with: str | None) -> None:  # fmt: skip
    """`charlm sample` on a lines model: one item per line (each ended by the model's end symbol), or one JSON
    object; on stderr how many samples were training items, held-out items and new (with --novel only the new are
    printed, drawn until there are --num-samples of them)."""
    from charlm.decoding.items import MOST_DRAWS

    if stream and not novel and not json_out and options.num_samples == 1:
        prefix = model.encode_prompt(prompt, unknown, replace_with)
        write_flushed(model.tokenizer.decode(prefix))
        sample = model.sample(prefix, options, on_text=write_flushed)
        sys.stdout.write("\n")
        return say_counts(model.item_counts(sample.samples), novel, [])
    result = model.sample_items(prompt, options, novel, unknown, replace_with)
    if json_out:
        print_json(result)
        say_missing(result)
    else:
        sys.stdout.writelines(row["text"] + "\n" for row in result["items"])
        capped = sum(row["ended"] == "length" for row in result["items"])
        say_counts(result, novel, [f"{capped} reached the length cap before the end symbol"] if capped else [])
    if novel and len(result["items"]) < options.num_samples:
        raise WorkError(
            f"only {result['new']} of the {options.num_samples} new items asked for in {result['sampled']} samples "
            f"(at most {MOST_DRAWS} per item asked for): most of its samples are items of the run's files; "
            "raise --temperature or ask for fewer"
        )


def say_missing(result: dict[str, Any]) -> None:
    """On stderr, in one line: the run's files no longer there and what new is then measured against."""
    if "unchecked" in result:
        stderr_console().print(f"samples not compared with the run's items: {result['unchecked']}", markup=False)
    elif "missing" in result:
        against = " or ".join(result["against"])
        stderr_console().print(f"{'; '.join(result['missing'])} not found: new means not in {against}", markup=False)


def say_counts(result: dict[str, Any], novel: bool, notes: list[str]) -> None:
    """On stderr: the run's files no longer there, then how many samples were training items, held-out items and
    new, and `notes`."""
    say_missing(result)
    if "new" in result:
        n, left_out = result["sampled"], result["sampled"] > result["new"]
        counts = (
            f"{n} sample{'s' * (n != 1)}: {result['training']} in training, {result['held_out']} held out "
            f"(validation/test), {result['new']} new"
            + (f", {result['unfinished']} unfinished (cut by a cap, or empty)" if result.get("unfinished") else "")
            + (" (only the new printed)" if novel and left_out else "")
        )
        notes = [counts, *notes]
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
    from charlm.api.entry import load

    model = load(checkpoint_path(checkpoint), device)  # a bad checkpoint before a bad file
    model.require("lines")  # another family is refused in one line
    text, where = candidates(file)
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


def candidates(file: str) -> tuple[str, str]:
    """The text `charlm score` ranks, and how messages name it: standard input for -, else the file's."""
    if file == "-":  # only the command line has a standard input to read: the Python API is given the text
        from charlm.data.corpus import decode_utf8

        return decode_utf8(sys.stdin.buffer.read(), "standard input"), "standard input"
    from charlm.data.lines import read_candidates

    return read_candidates(file)


def refuse_novel(model: Any) -> None:
    raise UsageError(
        f"--novel compares whole items with a list's training items; {model.path} is {model.family.noun} "
        "(train one with data.format lines)"
    )
