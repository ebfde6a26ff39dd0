"""Fetching a corpus: streamed to a temp file beside the destination, verified by SHA-256, renamed into place."""

from __future__ import annotations

import hashlib
import http.client
import os
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from charlm.files import atomic_write, remove_stale_temps
from charlm.errors import UsageError, WorkError

TINY_SHAKESPEARE_URL = "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
TINY_SHAKESPEARE_SHA256 = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"
DEFAULT_DEST = Path("data/tinyshakespeare.txt")
URL_ENV = "CHARLM_DATA_URL"
OFFLINE_HINT = f"for offline use pass --url file:///path/to/input.txt or set {URL_ENV}"
CHUNK = 1 << 16


class TransientError(Exception):
    """Worth another try: refused or reset connection, timeout, 5xx/429, truncated body."""


@dataclass
class DownloadResult:
    path: Path
    sha256: str
    bytes: int
    downloaded: bool  # False when a verified file was already there


def resolve_url(url: str | None) -> str:
    """--url wins over $CHARLM_DATA_URL, which wins over the canonical URL."""
    return url or os.environ.get(URL_ENV) or TINY_SHAKESPEARE_URL


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


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
    except OSError as e:
        raise WorkError(f"cannot create folder {dest.parent}: {e.strerror}") from e
    remove_stale_temps(dest)  # left by an earlier run that was killed mid-download
    attempt = 0
    while True:
        try:
            digest, size = _fetch_once(url, dest, timeout, sha256, progress)
            return DownloadResult(dest, digest, size, downloaded=True)
        except TransientError as e:
            if attempt == retries:
                raise WorkError(f"download of {url} failed after {retries + 1} attempt(s): {e}; {OFFLINE_HINT}") from None
        time.sleep(backoff * 2**attempt)  # 1, 2, 4, 8 s: gives up within ~15 s of refused connections
        attempt += 1


def _check_url(url: str) -> None:
    scheme = urllib.parse.urlparse(url).scheme
    if scheme not in ("http", "https", "file"):
        raise UsageError(f"unsupported URL {url!r}: use http://, https:// or file://")
    if scheme == "file":
        path = Path(urllib.request.url2pathname(urllib.parse.urlparse(url).path))
        if not path.is_file():
            raise UsageError(f"no such file for --url {url}: {path}")


def _fetch_once(url: str, dest: Path, timeout: float, sha256: str | None,
                progress: Callable[[int, int | None], None] | None) -> tuple[str, int]:
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
    except (ConnectionError, TimeoutError, socket.timeout, http.client.HTTPException) as e:
        raise TransientError(f"the connection broke while reading ({_describe(e)})") from None


def _describe(e: BaseException) -> str:
    return getattr(e, "strerror", None) or str(e) or type(e).__name__


def ensure_corpus(path: Path, say: Callable[[str], None]) -> None:
    """Fetch tiny-shakespeare to the default data path when it is missing (from $CHARLM_DATA_URL if set)."""
    if path.exists():
        return
    url = resolve_url(None)
    say(f"{path} is missing: downloading tiny-shakespeare from {url}")
    download(url, path)
