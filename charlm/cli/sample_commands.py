"""`charlm sample` (continue a prompt with a decoder, or rewrite sources with an encoder-decoder) and `charlm fill`
(an encoder's guesses for hidden characters); registered on the app in charlm/cli/app.py, like it parsing and messages
only."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Annotated, Optional

import typer

from charlm.cli import items_commands as cli_items
from charlm.cli.support import (
    CHECKPOINT_HELP,
    REPLACE_HELP,
    DeviceOption,
    EnsembleOption,
    Precision,
    PrecisionOption,
    Unknown,
    check_replacement,
    checkpoint_path,
    load_ensemble,
    needs_torch,
    print_json,
    write_flushed,
)
from charlm.data.tokenizer import UNKNOWN_CHAR, UnknownPolicy
from charlm.decoding.options import MAX_FILL_CANDIDATES, DecodeOptions
from charlm.errors import UsageError
from charlm.progress import stderr_console

# `charlm sample`'s options, named here so that its signature stays short enough to read at a glance.
CheckpointArgument = Annotated[Optional[str], typer.Argument(help=CHECKPOINT_HELP, show_default=False)]
PromptOption = Annotated[Optional[str], typer.Option(help="Text to continue. Default: a newline.")]
PromptFileOption = Annotated[
    Optional[str], typer.Option(help="Read the prompt from this UTF-8 file instead; - reads standard input.")
]
MaxNewTokensOption = Annotated[
    Optional[int],
    typer.Option(min=0, help="Characters to generate per sample. Default: the checkpoint's sample.max_new_tokens."),
]
TemperatureOption = Annotated[Optional[float], typer.Option(min=0.0, help="Softmax temperature; 0 = greedy (argmax).")]
TopKOption = Annotated[
    Optional[int], typer.Option(min=1, help="Keep only the K most likely characters (clamped to the vocabulary).")
]
TopPOption = Annotated[
    Optional[float],
    typer.Option(help="Nucleus: keep the smallest set of characters reaching probability P (0 <= P <= 1)."),
]
SeedOption = Annotated[
    Optional[int],
    typer.Option(help="Same seed and options give the same text: on a GPU too, unless its logits round apart."),
]
NumSamplesOption = Annotated[int, typer.Option(min=1, max=1024, help="Samples generated together as one batch.")]
StopOption = Annotated[
    Optional[list[str]],
    typer.Option(
        help="End a sample just before the first occurrence of this string, which is left out (as in the "
        "server). Repeatable."
    ),
]
UnknownOption = Annotated[Unknown, typer.Option(help="Prompt characters outside the vocabulary.")]
ReplaceWithOption = Annotated[Optional[str], typer.Option(help=REPLACE_HELP)]
StreamOption = Annotated[
    Optional[bool],
    typer.Option(
        "--stream/--no-stream", help="Print characters as they come (default: on a terminal, with one sample)."
    ),
]
NoCacheOption = Annotated[
    bool, typer.Option("--no-cache", help="Recompute the whole window every step (slow; the reference path).")
]
CompileOption = Annotated[
    bool,
    typer.Option(
        "--compile",
        help="Compile the decoding step (torch.compile): seconds to compile first, then ~1.6x faster batch-1 "
        "steps (int8 on big models, float32 on small ones); pays for long texts and --interactive. The text can "
        "differ from the uncompiled one's after a while.",
    ),
]
SampleJsonOption = Annotated[
    bool,
    typer.Option(
        "--json",
        help='Print one JSON object: {"samples": [...], "chars_per_s": ..., "replaced": N, "runtime": ...} '
        "(replaced: characters a byte model produced that were not valid UTF-8, shown as U+FFFD; runtime: torch, "
        "or onnxruntime for an ONNX export; with --compile also "
        '"compile_s", the seconds compiling took, which chars_per_s leaves out).',
    ),
]
BeamOption = Annotated[
    int,
    typer.Option(min=1, max=64, help="Encoder-decoder: beam search with N hypotheses, length-normalised (1 = greedy)."),
]
InteractiveOption = Annotated[
    bool,
    typer.Option(
        "--interactive",
        "-i",
        help="Load once, then continue prompt after prompt (/help lists the commands); without a terminal, one "
        "prompt per input line.",
    ),
]
NovelOption = Annotated[
    bool,
    typer.Option(
        "--novel",
        help="A lines model: print only new items, in none of the run's files (training, validation and test "
        "splits), drawing until there are --num-samples of them; stderr counts the samples in training, held out "
        "and new.",
    ),
]


def sample_(
    checkpoint: CheckpointArgument = None,
    prompt: PromptOption = None,
    prompt_file: PromptFileOption = None,
    max_new_tokens: MaxNewTokensOption = None,
    temperature: TemperatureOption = None,
    top_k: TopKOption = None,
    top_p: TopPOption = None,
    seed: SeedOption = None,
    num_samples: NumSamplesOption = 1,
    stop: StopOption = None,
    unknown: UnknownOption = Unknown.error,
    replace_with: ReplaceWithOption = None,
    device: DeviceOption = "auto",
    stream: StreamOption = None,
    no_cache: NoCacheOption = False,
    precision: PrecisionOption = Precision.float32,
    compile_step: CompileOption = False,
    json_out: SampleJsonOption = False,
    beam: BeamOption = 1,
    interactive: InteractiveOption = False,
    ensemble: EnsembleOption = None,
    novel: NovelOption = False,
) -> None:
    """Generate text from a checkpoint, continuing a prompt (KV-cached; temperature, top-k, top-p, stop strings).

    An encoder-decoder rewrites the prompt instead (greedy, or --beam N): --prompt SOURCE prints its target;
    --prompt-file FILE (- for standard input) rewrites every line and prints source<TAB>target lines. A lines model
    (data.format lines) makes --num-samples whole items, one per line, each ended by its end symbol; --prompt begins
    each item (default: nothing), --max-new-tokens is only a cap, and --json lists the items with their log-likelihoods;
    stderr (and --json) counts the samples in the run's training split, held out (validation/test) and new.
    """
    needs_torch()
    from charlm.api.entry import load
    from charlm.decoding.options import check_values

    _refuse_prompt_clashes(prompt, prompt_file, interactive, json_out, num_samples)
    check_replacement(replace_with)
    # flag mistakes first, before looking for a checkpoint
    given = {"max_new_tokens": max_new_tokens, "temperature": temperature, "top_k": top_k, "top_p": top_p}
    check_values({**given, "stop": stop, "compile": compile_step, "use_cache": not no_cache, "beam": beam})
    model = load(checkpoint_path(checkpoint), device, precision.value)  # a bad checkpoint before a bad prompt
    members = load_ensemble(model, ensemble, device, precision.value)
    if novel and not model.family.makes_items:
        cli_items.refuse_novel(model)
    if model.family.rewrites_sources:
        _refuse_text_only_flags(max_new_tokens, num_samples, stop, stream, no_cache, compile_step, interactive)
        room = model.config.model.block_size  # the decoding caps it at the context less the start symbol
        top_p = 1.0 if top_p is None else top_p  # 0 keeps the most likely character alone, as everywhere else
        decoding = DecodeOptions(beam=beam, temperature=temperature or 0.0, top_k=top_k, top_p=top_p, seed=seed)
        rewriting = Rewriting(decoding.with_(max_new_tokens=room), unknown.value, replace_with, members)
        return rewrite_lines(model, prompt, prompt_file, rewriting, json_out)
    model.require("decoder")  # an encoder is refused here in one line: it fills blanks, see `charlm fill`
    if beam != 1:
        raise UsageError("--beam is for encoder-decoder models; a decoder samples (--temperature 0 is greedy)")
    text = _decoder_prompt(model, prompt, prompt_file)
    options = _decode_options(model, given, seed, stop, num_samples, no_cache, compile_step)
    if interactive:
        from charlm.cli.repl import run_repl

        return run_repl(model, options, unknown.value, replace_with)
    if model.family.makes_items:
        streams = stream if stream is not None else sys.stdout.isatty()
        return cli_items.print_items(model, text, options, novel, json_out, streams, unknown.value, replace_with)
    prompt_ids = model.encode_prompt(text, unknown.value, replace_with)
    streaming = not json_out and num_samples == 1 and (stream if stream is not None else sys.stdout.isatty())
    if streaming:
        write_flushed(model.tokenizer.decode(prompt_ids))  # the prompt as the model sees it
    result = model.sample(prompt_ids, options, on_text=write_flushed if streaming else None)
    print_samples(model, result, streaming, json_out, compile_step)


def _refuse_prompt_clashes(
    prompt: str | None, prompt_file: str | None, interactive: bool, json_out: bool, num_samples: int
) -> None:
    """One prompt source at most, and none with --interactive, whose prompts come from the keyboard."""
    if prompt is not None and prompt_file is not None:
        raise UsageError("give --prompt or --prompt-file, not both")
    if interactive and (prompt is not None or prompt_file is not None or json_out or num_samples != 1):
        raise UsageError(
            "--interactive reads its prompts from the keyboard: leave out --prompt, --prompt-file, --json and "
            "--num-samples"
        )


def _refuse_text_only_flags(
    max_new_tokens: int | None,
    num_samples: int,
    stop: list[str] | None,
    stream: bool | None,
    no_cache: bool,
    compile_step: bool,
    interactive: bool,
) -> None:
    """The flags of continuing a text, refused together for an encoder-decoder."""
    given = {
        "--max-new-tokens": max_new_tokens is not None,
        "--num-samples": num_samples != 1,
        "--stop": bool(stop),
        "--stream": stream is not None,
        "--no-cache": no_cache,
        "--compile": compile_step,
        "--interactive": interactive,
    }
    if not_for_pairs := [flag for flag, used in given.items() if used]:
        raise UsageError(
            f"{', '.join(not_for_pairs)}: not for an encoder-decoder, which rewrites each source whole (use "
            "--prompt-file - to rewrite lines as they come)"
        )


def _decoder_prompt(model, prompt: str | None, prompt_file: str | None) -> str:
    """The text a decoder continues: a lines model's item beginning (one line, empty by default), else the prompt
    as given (a newline by default)."""
    from charlm.data.corpus import read_prompt

    if model.family.makes_items:
        return read_prompt(prompt_file).rstrip("\r\n") if prompt_file is not None else (prompt or "")
    return read_prompt(prompt_file) if prompt_file is not None else ("\n" if prompt is None else prompt)


def _decode_options(
    model, given: dict, seed: int | None, stop: list[str] | None, num_samples: int, no_cache: bool, compile_step: bool
) -> DecodeOptions:
    """The checkpoint's sampling defaults with the flags given on top, checked."""
    from charlm.decoding.options import DecodeOptions

    return DecodeOptions.from_config(
        model.config.sample,
        **given,
        seed=seed,
        stop=stop or [],
        num_samples=num_samples,
        use_cache=not no_cache,
        compile=compile_step,
    ).checked()


def print_samples(model, result, streamed: bool, json_out: bool, compile_step: bool) -> None:
    """A plain decoder's samples (a SampleResult) once drawn: the line that ends a streamed one, each printed whole
    (a header before each of several), or one JSON object."""
    if json_out:
        out = {
            "samples": result.samples,
            "chars_per_s": result.chars_per_s,
            "replaced": result.replaced,
            "runtime": model.runtime,
        }
        print_json(out | ({"compile_s": round(result.compile_seconds, 3)} if compile_step else {}))
    elif streamed:
        sys.stdout.write("\n")
    else:
        for i, sample_text in enumerate(result.samples):
            if len(result.samples) > 1:
                sys.stdout.write(f"--- sample {i + 1} ---\n")
            sys.stdout.write(sample_text + "\n")


@dataclass
class Rewriting:
    """How `charlm sample` rewrites an encoder-decoder's sources: the decoding, unseen characters, the ensemble."""

    options: DecodeOptions
    unknown: UnknownPolicy
    replace_with: str | None
    members: list

    @property
    def beam(self) -> int:
        return self.options.beam


def rewrite_lines(model, prompt, prompt_file, rewriting: Rewriting, json_out: bool) -> None:
    """--prompt: the target alone; --prompt-file: source<TAB>target for every non-blank line (with a features
    column, the line in the training file's layout: source, features and target)."""
    unknown, replace_with, members, beam = rewriting.unknown, rewriting.replace_with, rewriting.members, rewriting.beam
    from charlm.data.corpus import read_prompt

    if prompt_file is not None:
        lines = [line.removesuffix("\r") for line in read_prompt(prompt_file).split("\n")]
        numbered = [(n, line) for n, line in enumerate(lines, start=1) if line.strip()]
    elif prompt is None:
        raise UsageError("an encoder-decoder needs a source: --prompt SOURCE, or --prompt-file FILE (- for stdin)")
    else:
        numbered = [(1, prompt)]
    for number, line in numbered:
        try:
            model.encode_source(line, unknown, replace_with)
        except UsageError as e:
            where = f"line {number} of {prompt_file}: " if prompt_file is not None else ""
            raise UsageError(where + str(e)) from None
    sources = [line for _, line in numbered]
    unseen = [model.unseen_inputs(line) for line in sources]
    if any(unseen):  # --unknown replace (error stopped above): say how much of the input was not read as written
        learned = UNKNOWN_CHAR in model.tokenizer.stoi
        what = "read as the unknown symbol" if learned else "read as a stand-in (the model learned no unknown symbol)"
        what = f"read as {replace_with!r}" if replace_with is not None else what
        noun = "input" if model.tokenizer.features else "character"
        kinds = f"{noun}{'' if sum(unseen) == 1 else 's'}" + (" (characters or features)" if noun == "input" else "")
        stderr_console().print(
            f"{sum(unseen):,} {kinds} the model never saw, in {sum(n > 0 for n in unseen):,} of {len(sources):,} "
            f"sources, {'left out' if unknown == 'skip' else what}",
            markup=False,
        )
    targets = model.rewrite(sources, rewriting.options, unknown, replace_with, members)
    if json_out:
        rows = [{"source": line, "target": t} for (_, line), t in zip(numbered, targets, strict=True)]
        together = {"ensemble": [str(m.path) for m in [model, *members]]} if members else {}
        print_json({"targets": rows, "beam": beam, "runtime": model.runtime} | together)
    elif prompt_file is None:
        sys.stdout.write(targets[0] + "\n")
    else:
        layout = model.config.data.columns
        sys.stdout.writelines(
            _data_line(line, t, layout) + "\n" for (_, line), t in zip(numbered, targets, strict=True)
        )


def _data_line(source: str, target: str, layout: str) -> str:
    """A rewritten source as a line of the training file's layout (data.columns): source<TAB>target, or with the
    features column where the file has it (the shared tasks' submission format)."""
    if layout == "source-target-features":
        chars, _, features = source.partition("\t")
        return f"{chars}\t{target}\t{features}"
    return f"{source}\t{target}"


def fill(
    checkpoint: Annotated[Optional[str], typer.Argument(help=CHECKPOINT_HELP, show_default=False)] = None,
    prompt: Annotated[
        str, typer.Option(help="Text with each hidden character marked by --mask-char, e.g. 'ROM_O AND JUL_ET'.")
    ] = "ROM_O AND JUL_ET",
    mask_char: Annotated[str, typer.Option(help="The character that marks a hidden one.")] = "_",
    top: Annotated[int, typer.Option(min=1, max=MAX_FILL_CANDIDATES, help="Candidates shown per blank.")] = 5,
    device: DeviceOption = "auto",
    json_out: Annotated[
        bool,
        typer.Option("--json", help='Print {"text": ..., "blanks": [{"position", "candidates": [[char, p], ...]}]}.'),
    ] = False,
) -> None:
    """An encoder (model.arch: encoder) fills every blank of a text at once, with each blank's likeliest characters.

    Prints the filled text, then a line per blank with its candidates and their probabilities.
    """
    needs_torch()
    from charlm.api.entry import load
    from charlm.cli.plot import shown_char

    model = load(checkpoint_path(checkpoint), device)
    result = model.fill(prompt, mask_char, top)
    if json_out:
        return print_json(result)
    sys.stdout.write(result["text"] + "\n")
    for blank in result["blanks"]:
        shown = ", ".join(f"{shown_char(c)!s} {p:.3f}" for c, p in blank["candidates"])
        sys.stdout.write(f"  position {blank['position']}: {shown}\n")
