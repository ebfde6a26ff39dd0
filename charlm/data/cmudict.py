"""CMUdict's .dict file converted to word<TAB>phonemes pairs for data.format pairs (`charlm download cmudict`)."""

from __future__ import annotations

import re
from pathlib import Path

from charlm.errors import WorkError
from charlm.files import atomic_write

# The CMU Pronouncing Dictionary's .dict format is `word PH1 PH2 ...`: lowercase words, ARPAbet phonemes with stress
# digits (0, 1, 2) on the vowels, alternates as `word(2) ...`, and on a few lines a comment after `#`. The TSV written
# for data.format: pairs is `word<TAB>PH1 PH2 ...`, UTF-8, one line per pronunciation, in the file's order:
# - comments are stripped (they note a word's origin, "# place, irish", not its pronunciation);
# - alternates are kept, each on a line of its own (`read  R EH D`, `read  R IY D`): the published CMUdict figures
#   count a word right when it matches any of its pronunciations, the pairs split keeps a word's lines on one side,
#   and `charlm eval` scores each word against all of them. One line per pronunciation keeps the plain two-column
#   TSV every seq2seq toolkit reads (training on both answers teaches the model that both occur);
# - stress digits are stripped (AH0 -> AH, EY1 -> EY): the 39-phoneme task that published G2P figures measure
#   (Bisani & Ney 2008 and the neural models after them); an alternate that only differed in stress is then a
#   duplicate and is written once. `charlm download cmudict-stress` keeps the digits (data/cmudict-stress.tsv);
# - words keep the file's spelling and case (lowercase), and phonemes are joined by single spaces.
# Blank lines and whole-line comments (`#`, or `;;;` in the older cmudict-0.7b) are skipped.
ALTERNATE = re.compile(r"\(\d+\)$")  # the (2) of `word(2)`


def cmudict_to_tsv(source: Path, dest: Path, stress: bool = False) -> str:
    """Convert a CMUdict .dict file to `word<TAB>phonemes` lines (see above), written atomically; the summary line."""
    words: set[str] = set()
    written: set[tuple[str, str]] = set()
    same = comments = 0

    def write(f) -> None:
        nonlocal same, comments
        with open(source, encoding="utf-8") as lines:
            for number, line in enumerate(lines, start=1):
                body, mark, _ = ("", "#", "") if line.startswith(";;;") else line.partition("#")
                comments += bool(mark)
                fields = body.split()
                if not fields:
                    continue
                if len(fields) == 1:
                    raise WorkError(
                        f"{source} line {number} is not `word PHONEME ...` (it reads {line.strip()[:60]!r}); "
                        "check the mirror"
                    )
                word = ALTERNATE.sub("", fields[0])
                phonemes = " ".join(fields[1:] if stress else (p.rstrip("012") for p in fields[1:]))
                if (word, phonemes) in written:
                    same += 1
                    continue
                words.add(word)
                written.add((word, phonemes))
                f.write(f"{word}\t{phonemes}\n".encode())

    try:
        atomic_write(dest, write)
    except UnicodeDecodeError as e:
        raise WorkError(f"{source} is not UTF-8 text ({e.reason}); check the mirror") from None
    except OSError as e:
        raise WorkError(f"cannot write {dest}: {e.strerror or e}") from None
    if not words:
        dest.unlink()
        raise WorkError(f"{source} holds no `word PHONEME ...` line; check the mirror")
    kept = "stress digits kept" if stress else f"stress digits stripped, {same:,} alternates then the same written once"
    return (
        f"{dest}: {len(words):,} words, {len(written):,} pronunciations, one per line ({comments:,} comments "
        f"stripped, {kept})"
    )


def cmudict_with_stress(source: Path, dest: Path) -> str:
    return cmudict_to_tsv(source, dest, stress=True)
