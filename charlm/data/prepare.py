"""Preparing a corpus once: the text streamed in chunks, encoded with vectorised lookups into a flat token file that
every run (and every DDP rank) memory-maps, so start-up and memory do not grow with the corpus.

Beside a source `data/big.txt` (or a folder `data/books/`) live `.big.txt.char-tokens.bin` (the ids: uint8 for at
most 256 symbols, 16-bit up to 32,767, else 32-bit) and `.big.txt.char-tokens.json` (vocabulary, symbol counts, and
the source's names, sizes, mtimes and SHA-256). Where the source's folder is not writable they go to
$XDG_CACHE_HOME/charlm/prepared (default ~/.cache/charlm/prepared). A prepared file is used only while the source is
unchanged and the file checks out (size, and a digest of the whole file up to 64 MiB, of 256 spread blocks beyond);
otherwise it is rebuilt. Writes go through temp files renamed into place, under a lock, so a crash, a full disk or a
second run preparing at the same moment never leaves a half-written file in use.
"""

from __future__ import annotations

import codecs
import contextlib
import ctypes
import hashlib
import json
import mmap
import os
import time
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from charlm.data.download import DEFAULT_DEST, builtin_at
from charlm.data.tokenizer import ByteTokenizer, CharTokenizer, Tokenizer
from charlm.errors import UsageError, WorkError
from charlm.files import atomic_write

FORMAT = 1
CHUNK = 8 << 20  # bytes read at a time: bounds memory whatever the corpus size
SEPARATOR = "\n\n"  # between the files of a folder, so one file's last line never runs into the next one's first
FULL_DIGEST_LIMIT = 64 << 20  # prepared files up to this size are checked whole at every start
SAMPLED_BLOCKS, BLOCK = 256, 4096
ANNOUNCE_BYTES = 16 << 20  # sources at least this big say that they are being prepared, and how fast it went
UNICODE_SIZE = 0x110000


@dataclass
class Prepared:
    """A prepared corpus: its memory-mapped ids (N,) and the tokenizer that reads them."""

    ids: torch.Tensor
    tokenizer: Tokenizer
    counts: dict[int, int]  # id -> occurrences in the whole corpus
    source: Path


def id_dtype(vocab_size: int) -> torch.dtype:
    return torch.uint8 if vocab_size <= 256 else torch.int16 if vocab_size <= 32767 else torch.int32


# ---------------------------------------------------------------------------- the source


def data_bytes(path: str | Path) -> int:
    """The size of the files a data path stands for, in bytes."""
    return sum(f.stat().st_size for f in source_files(Path(path)))


def missing_data(path: Path) -> UsageError:
    """The one line for a data path that is not there. A run keeps its data path as it was given, so a relative one
    is read from where charlm runs now, which may not be where the run trained: the line names that folder."""
    where = "" if path.is_absolute() else f" in {Path.cwd()} (a relative path is read from the folder charlm runs in)"
    corpus = builtin_at(path)
    command = "" if corpus is None else "charlm download" + ("" if corpus.dest == DEFAULT_DEST else f" {corpus.name}")
    fetch = f"run `{command}`, or " if command else ""
    return UsageError(
        f"data path not found: {path}{where}; {fetch}pass --data PATH to a text file or a folder of texts"
    )


def source_files(path: Path) -> list[Path]:
    """The files a data path stands for: itself, or a folder's files (recursively, hidden ones skipped) by name."""
    if not path.exists():
        raise missing_data(path)
    if path.is_file():
        if path.stat().st_size == 0:
            raise UsageError(f"data file is empty: {path} (give a UTF-8 text file with some text in it)")
        return [path]
    if not path.is_dir():
        raise UsageError(f"data path is neither a file nor a folder: {path}")
    files = sorted(
        (p for p in path.rglob("*") if p.is_file() and not _hidden(p.relative_to(path))),
        key=lambda p: p.relative_to(path).as_posix(),
    )
    files = [p for p in files if p.stat().st_size > 0]
    if not files:
        raise UsageError(f"data folder {path} holds no non-empty files; put text files in it or pass --data FILE")
    return files


def _hidden(relative: Path) -> bool:
    return any(part.startswith(".") for part in relative.parts)


def fingerprint(path: Path, files: list[Path]) -> list[dict[str, Any]]:
    """What says whether the source changed: every file's name, size and mtime (cheap: no reading)."""
    out = []
    for f in files:
        st = f.stat()
        out.append(
            {
                "name": f.relative_to(path).as_posix() if path.is_dir() else f.name,
                "size": st.st_size,
                "mtime_ns": st.st_mtime_ns,
            }
        )
    return out


def prepared_paths(path: Path, kind: str) -> tuple[Path, Path]:
    """Where a source's prepared files go: beside it when that folder is writable, else in the user's cache."""
    stem = f".{path.name}.{kind}-tokens"
    folder = path.parent
    if not os.access(folder, os.W_OK):
        digest = hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:16]
        folder = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "charlm" / "prepared"
        stem = f"{digest}-{path.name}.{kind}-tokens"
    return folder / f"{stem}.bin", folder / f"{stem}.json"


# ---------------------------------------------------------------------------- reading in chunks


def _pieces(files: list[Path], root: Path, decode: bool) -> Iterator[tuple[int, bytes, str]]:
    """(file index, raw bytes, their text) pieces of every file in order; the separator between files is a piece
    of its own (index -1). With decode, the text is strict UTF-8 and a file that is not is refused by name."""
    for i, f in enumerate(files):
        if i:
            yield -1, SEPARATOR.encode(), SEPARATOR
        decoder = codecs.getincrementaldecoder("utf-8")(errors="strict") if decode else None
        offset = 0
        try:
            with open(f, "rb") as fh:
                while raw := fh.read(CHUNK):
                    text = ""
                    if decoder is not None:
                        held = decoder.getstate()[0]
                        try:
                            text = decoder.decode(raw)
                        except UnicodeDecodeError as e:
                            raise _not_utf8(
                                f, root, len(files), (held + raw)[e.start], offset - len(held) + e.start
                            ) from None
                    yield i, raw, text
                    offset += len(raw)
        except OSError as e:
            raise UsageError(f"cannot read data file {f}: {e.strerror}") from None
        if decoder is not None:
            try:
                decoder.decode(b"", final=True)
            except UnicodeDecodeError:
                raise _not_utf8(f, root, len(files), None, offset) from None


def _not_utf8(f: Path, root: Path, n_files: int, byte: int | None, at: int) -> UsageError:
    what = f"data file {f}" if n_files == 1 else f"data folder {root} holds {f.relative_to(root)}, which"
    where = f"byte 0x{byte:02x} at byte offset {at}" if byte is not None else "it ends inside a multi-byte character"
    return UsageError(
        f"{what} is not UTF-8 text: {where} (remove or convert it, e.g. `iconv -f latin1 -t utf-8`, "
        "or train on bytes: --set data.tokenizer=byte)"
    )


def _buffer(t: torch.Tensor) -> memoryview:
    """A contiguous tensor's bytes without a copy (torch offers no buffer protocol, and NumPy is not a dependency)."""
    t = t.contiguous()
    return memoryview((ctypes.c_char * (t.numel() * t.element_size())).from_address(t.data_ptr())).cast("B")


def _codepoints(text: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(text.encode("utf-32-le")), dtype=torch.int32)  # (n,)


# ---------------------------------------------------------------------------- preparing


def _prepare(path: Path, files: list[Path], kind: str, bin_path: Path, json_path: Path) -> dict[str, Any]:
    """Two streamed passes for characters (vocabulary, then ids), one for bytes; returns the JSON written."""
    decode = kind == "char"
    digests = [hashlib.sha256() for _ in files]
    lut = None
    if decode:  # pass 1: which characters, how often
        counts = torch.zeros(UNICODE_SIZE, dtype=torch.int64)
        for _, _, text in _pieces(files, path, decode):
            if text:
                counts += torch.bincount(_codepoints(text), minlength=UNICODE_SIZE)
        present = counts.nonzero().flatten()  # sorted code points: the vocabulary
        lut = torch.full((UNICODE_SIZE,), -1, dtype=torch.int32)
        lut[present] = torch.arange(len(present), dtype=torch.int32)
    else:
        counts = torch.zeros(256, dtype=torch.int64)
    dtype = id_dtype(256 if not decode else int((counts > 0).sum()))
    total = 0

    def write(f: Any) -> None:  # pass 2 (the only one for bytes): ids, and the sources' SHA-256
        nonlocal total
        for i, raw, text in _pieces(files, path, decode):
            if i >= 0:
                digests[i].update(raw)
            if lut is not None:
                ids = lut[_codepoints(text).long()].to(dtype) if text else torch.empty(0, dtype=dtype)
            else:
                ids = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
                counts.add_(torch.bincount(ids, minlength=256))
            f.write(raw if lut is None else _buffer(ids))
            total += len(ids)

    atomic_write(bin_path, write)
    if decode:
        present_list = counts.nonzero().flatten().tolist()
        vocab: list[str] | None = [chr(c) for c in present_list]
        symbol_counts = {str(i): int(counts[c]) for i, c in enumerate(present_list)}
    else:
        vocab = None
        symbol_counts = {str(i): int(c) for i, c in enumerate(counts.tolist()) if c}
    meta = {
        "format": FORMAT,
        "tokenizer": kind,
        "vocab": vocab,
        "counts": symbol_counts,
        "tokens": total,
        "dtype": str(dtype).removeprefix("torch."),
        "bin_digest": _digest(bin_path, total * _itemsize(dtype)),
        "source": {
            "path": path.name,
            "folder": path.is_dir(),
            "separator": SEPARATOR if path.is_dir() else None,
            "files": [{**fp, "sha256": d.hexdigest()} for fp, d in zip(fingerprint(path, files), digests, strict=True)],
        },
    }
    atomic_write(json_path, lambda f: f.write((json.dumps(meta, ensure_ascii=False) + "\n").encode()))
    return meta


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty(0, dtype=dtype).element_size()


def _digest(bin_path: Path, size: int) -> str:
    """blake2b of the whole file up to FULL_DIGEST_LIMIT, else of SAMPLED_BLOCKS blocks spread over it."""
    h = hashlib.blake2b(digest_size=16)
    with open(bin_path, "rb") as f:
        if size <= FULL_DIGEST_LIMIT:
            while raw := f.read(CHUNK):
                h.update(raw)
        else:
            for i in range(SAMPLED_BLOCKS):
                f.seek((size - BLOCK) * i // (SAMPLED_BLOCKS - 1))
                h.update(f.read(BLOCK))
    return h.hexdigest()


# ---------------------------------------------------------------------------- opening


def _stale_reason(meta: Any, kind: str, path: Path, files: list[Path], bin_path: Path) -> str | None:
    """Why a prepared file cannot be used as it is (None: it can)."""
    if not isinstance(meta, dict) or meta.get("format") != FORMAT or meta.get("tokenizer") != kind:
        return "its description is missing, damaged or from another version"
    try:
        recorded = [{k: f[k] for k in ("name", "size", "mtime_ns")} for f in meta["source"]["files"]]
        dtype = getattr(torch, meta["dtype"])
        expected_size = int(meta["tokens"]) * _itemsize(dtype)
    except (KeyError, TypeError, AttributeError, ValueError):
        return "its description is damaged"
    if recorded != fingerprint(path, files):
        if [(r["name"], r["size"]) for r in recorded] != [(f["name"], f["size"]) for f in fingerprint(path, files)]:
            return "the source changed since it was prepared"
        if [f["sha256"] for f in meta["source"]["files"]] != [_sha256(f) for f in files]:
            return "the source changed since it was prepared"
        return "touched"  # same bytes, new mtimes: only the description needs refreshing
    if not bin_path.is_file() or bin_path.stat().st_size != expected_size:
        return "the token file is missing or has the wrong size (truncated?)"
    if _digest(bin_path, expected_size) != meta.get("bin_digest"):
        return "the token file is damaged (its digest does not match)"
    return None


def _sha256(f: Path) -> str:
    h = hashlib.sha256()
    with open(f, "rb") as fh:
        while raw := fh.read(CHUNK):
            h.update(raw)
    return h.hexdigest()


@contextlib.contextmanager
def _lock(json_path: Path) -> Iterator[None]:
    """One preparer at a time per corpus (POSIX); the others wait, then find it prepared."""
    try:
        import fcntl
    except ImportError:  # Windows: temp files and renames still keep every file whole
        yield
        return
    lock_path = json_path.with_suffix(".lock")
    with open(lock_path, "a+b") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _read_meta(json_path: Path) -> Any:
    try:
        return json.loads(json_path.read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return None


def prepare(path: str | Path, kind: str, say: Callable[[str], None] = lambda _: None) -> Prepared:
    """The corpus at `path` as memory-mapped ids, prepared first when needed (see the module's docstring)."""
    path = Path(path)
    files = source_files(path)
    bin_path, json_path = prepared_paths(path, kind)
    try:
        bin_path.parent.mkdir(parents=True, exist_ok=True)
        with _lock(json_path):
            meta = _read_meta(json_path)
            reason = _stale_reason(meta, kind, path, files, bin_path) if meta is not None else "not prepared yet"
            if reason == "touched":
                meta["source"]["files"] = [
                    {**r, **fp} for r, fp in zip(meta["source"]["files"], fingerprint(path, files), strict=True)
                ]
                atomic_write(json_path, lambda f: f.write((json.dumps(meta, ensure_ascii=False) + "\n").encode()))
            elif reason is not None:
                size = sum(f.stat().st_size for f in files)
                big = size >= ANNOUNCE_BYTES  # small texts prepare in a blink: no need to say so
                if reason != "not prepared yet":
                    say(f"preparing {path} again: {reason}")
                elif big:
                    say(f"preparing {path} ({size / 1e6:,.0f} MB) once into {bin_path.name} ...")
                started = time.perf_counter()
                meta = _prepare(path, files, kind, bin_path, json_path)
                seconds = time.perf_counter() - started
                if big:
                    say(
                        f"prepared {path}: {meta['tokens']:,} tokens, {_vocab_size(meta)} symbols, "
                        f"{size / 1e6:,.1f} MB in {seconds:.1f} s ({size / 1e6 / max(seconds, 1e-9):,.0f} MB/s)"
                    )
    except OSError as e:
        raise WorkError(
            f"cannot prepare {path} into {bin_path.parent}: {e.strerror or e} (nothing half-written is "
            "kept; free some space or make the folder writable, then run again)"
        ) from None
    dtype = getattr(torch, meta["dtype"])
    count = int(meta["tokens"])
    ids = _map(bin_path, dtype) if count else torch.empty(0, dtype=dtype)
    tokenizer: Tokenizer = ByteTokenizer() if kind == "byte" else CharTokenizer(meta["vocab"])
    return Prepared(ids, tokenizer, {int(k): int(v) for k, v in meta["counts"].items()}, path)


_MAPPINGS: weakref.WeakSet[mmap.mmap] = weakref.WeakSet()  # every token file mapped by this process


def _map(bin_path: Path, dtype: torch.dtype) -> torch.Tensor:
    """The token file as a tensor backed by a private, read-only-in-practice mapping (nothing is ever written)."""
    with open(bin_path, "rb") as f:
        mapping = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)  # writable for torch, never written back
    _MAPPINGS.add(mapping)
    return torch.frombuffer(mapping, dtype=dtype)  # keeps the mapping alive


def release_mapped_pages() -> None:
    """Unmap the pages of token files read so far (they stay in the OS's file cache, and fault back in when read
    again). Without this, every page a random window or a full pass touched, and the large blocks the kernel maps
    around it, would count as this process's resident memory, growing with the corpus; called once per training
    step and every few evaluation batches, it keeps the resident size flat for a corpus of any size."""
    for mapping in list(_MAPPINGS):
        if hasattr(mmap, "MADV_DONTNEED"):  # POSIX; elsewhere the OS keeps its own accounting
            mapping.madvise(mmap.MADV_DONTNEED)


def _vocab_size(meta: dict[str, Any]) -> int:
    return 256 if meta["tokenizer"] == "byte" else len(meta["vocab"])
