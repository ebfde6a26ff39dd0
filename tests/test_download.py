"""`charlm download` against a real loopback HTTP server and file:// URLs, run as a real subprocess."""

import socket

import pytest
from conftest import EXCERPT_SHA256, FULL_CORPUS_BYTES, FULL_CORPUS_SHA256, assert_one_line_error, run_cli, sha256

VERIFY = ("--sha256", EXCERPT_SHA256)  # the shipped excerpt is not the default corpus: name its hash


def _no_temp_files(folder):
    return [p.name for p in folder.iterdir() if p.name.startswith(".")] == []


def test_file_url_writes_the_verified_default_corpus_then_keeps_it(full_corpus, tmp_path):
    first = run_cli("download", "--url", full_corpus.as_uri(), cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    dest = tmp_path / "data" / "tinyshakespeare.txt"
    assert sha256(dest) == FULL_CORPUS_SHA256 and dest.stat().st_size == FULL_CORPUS_BYTES
    again = run_cli("download", "--url", full_corpus.as_uri(), cwd=tmp_path)
    assert again.returncode == 0 and "already there" in again.stderr


def test_file_url_with_sha256_writes_the_file_then_keeps_it(corpus, tmp_path):
    first = run_cli("download", "--url", corpus.as_uri(), *VERIFY, cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    dest = tmp_path / "data" / "tinyshakespeare.txt"
    assert dest.read_bytes() == corpus.read_bytes()
    again = run_cli("download", "--url", corpus.as_uri(), *VERIFY, cwd=tmp_path)
    assert again.returncode == 0 and "already there, verified" in again.stderr


def test_the_default_hash_refuses_another_text(corpus, tmp_path):
    result = run_cli("download", "--url", corpus.as_uri(), cwd=tmp_path)
    assert_one_line_error(result, 1, "SHA-256", FULL_CORPUS_SHA256, "--sha256")
    assert not (tmp_path / "data" / "tinyshakespeare.txt").exists()


def test_http_download_and_the_env_mirror(server, tmp_path):
    result = run_cli("download", *VERIFY, cwd=tmp_path, env={"CHARLM_DATA_URL": server.url("good")})
    assert result.returncode == 0, result.stderr
    assert sha256(tmp_path / "data" / "tinyshakespeare.txt") == EXCERPT_SHA256
    assert server.requests == {"/good": 1}


def test_url_option_wins_over_the_env_mirror(server, tmp_path):
    dest = tmp_path / "x.txt"
    result = run_cli(
        "download", "--url", server.url("good"), "--dest", dest, *VERIFY, env={"CHARLM_DATA_URL": server.url("wrong")}
    )
    assert result.returncode == 0 and sha256(dest) == EXCERPT_SHA256


@pytest.fixture
def waits(monkeypatch) -> list[float]:
    """The backoff waits a download asks for, recorded instead of slept through."""
    import charlm.data.download

    asked: list[float] = []
    monkeypatch.setattr(charlm.data.download, "wait_before_retry", asked.append)
    return asked


def test_retry_after_a_transient_failure(server, tmp_path, waits):
    dest = tmp_path / "t.txt"
    result = run_cli("download", "--url", server.url("flaky"), "--dest", dest, "--retries", "2", *VERIFY)
    assert result.returncode == 0, result.stderr
    assert server.requests["/flaky"] == 2 and sha256(dest) == EXCERPT_SHA256
    assert waits == [1.0]  # one failure, one wait


def test_truncated_body_leaves_no_file(server, tmp_path, waits):
    dest = tmp_path / "t.txt"
    result = run_cli("download", "--url", server.url("truncated"), "--dest", dest, "--retries", "1", *VERIFY)
    assert_one_line_error(result, 1, server.url("truncated"), "truncated", "--url file://")
    assert not dest.exists() and _no_temp_files(tmp_path)
    assert server.requests["/truncated"] == 2  # truncation is transient: retried once


def test_truncated_mirror_over_file_url_leaves_no_file(corpus, tmp_path):
    half = tmp_path / "half.txt"
    half.write_bytes(corpus.read_bytes()[:50_000])
    dest = tmp_path / "out" / "t.txt"
    result = run_cli("download", "--url", half.as_uri(), "--dest", dest, *VERIFY)
    assert_one_line_error(result, 1, "SHA-256")
    assert not dest.exists() and _no_temp_files(dest.parent)


def test_wrong_hash_leaves_no_file_and_is_not_retried(server, tmp_path):
    dest = tmp_path / "t.txt"
    result = run_cli("download", "--url", server.url("wrong"), "--dest", dest, *VERIFY)
    assert_one_line_error(result, 1, "SHA-256", EXCERPT_SHA256)
    assert not dest.exists() and _no_temp_files(tmp_path)
    assert server.requests["/wrong"] == 1


def test_other_corpora_with_sha256_or_no_verify(tmp_path):
    text = tmp_path / "mine.txt"
    text.write_text("hello corpus\n")
    ok = run_cli("download", "--url", text.as_uri(), "--dest", tmp_path / "a.txt", "--sha256", sha256(text))
    assert ok.returncode == 0, ok.stderr
    unverified = run_cli("download", "--url", text.as_uri(), "--dest", tmp_path / "b.txt", "--no-verify")
    assert unverified.returncode == 0 and (tmp_path / "b.txt").read_text() == "hello corpus\n"


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_host_gives_up_quickly_with_an_offline_hint(tmp_path, waits):
    import inspect

    from charlm.data.download import download

    url = f"http://127.0.0.1:{_closed_port()}/input.txt"
    dest = tmp_path / "t.txt"
    # every attempt is made, but the test does not sleep through the 1 + 2 + 4 + 8 s of the default backoff
    result = run_cli("download", "--url", url, "--dest", dest, "--retries", "2")
    assert_one_line_error(result, 1, url, "after 3 attempt(s)", "CHARLM_DATA_URL")
    assert waits == [1.0, 2.0]  # doubling between attempts, none after the last
    assert not dest.exists() and _no_temp_files(tmp_path)
    defaults = inspect.signature(download).parameters
    retries, backoff = defaults["retries"].default, defaults["backoff"].default
    assert sum(backoff * 2**i for i in range(retries)) <= 15  # the default gives up within ~15 s of waiting


def test_stale_temp_file_from_a_crash_is_cleaned(corpus, tmp_path):
    dest = tmp_path / "t.txt"
    stale = tmp_path / ".t.txt.abc123.tmp"
    stale.write_bytes(b"half a download")
    result = run_cli("download", "--url", corpus.as_uri(), "--dest", dest, *VERIFY)
    assert result.returncode == 0 and not stale.exists() and sha256(dest) == EXCERPT_SHA256


def test_a_different_existing_file_is_kept_without_force(corpus, tmp_path):
    dest = tmp_path / "t.txt"
    dest.write_text("my own notes")
    result = run_cli("download", "--url", corpus.as_uri(), "--dest", dest, *VERIFY)
    assert_one_line_error(result, 2, "--force")
    assert dest.read_text() == "my own notes"
    forced = run_cli("download", "--url", corpus.as_uri(), "--dest", dest, "--force", *VERIFY)
    assert forced.returncode == 0 and sha256(dest) == EXCERPT_SHA256


def test_bad_urls_are_usage_errors(tmp_path):
    assert_one_line_error(run_cli("download", "--url", "ftp://example.com/x"), 2, "ftp://")
    assert_one_line_error(run_cli("download", "--url", (tmp_path / "missing.txt").as_uri()), 2, "missing.txt")
    assert_one_line_error(run_cli("download", "--url", tmp_path.as_uri()), 2, "is a folder", "corpus file in it")


def test_absurd_timeouts_are_refused_as_the_flag_is_read(server, tmp_path):
    from charlm.data.download import download
    from charlm.errors import UsageError

    dest = tmp_path / "t.txt"
    for value in ("inf", "1e300", "nan", "-inf", "0", "3601"):  # inf and 1e300 overflowed the socket's time_t
        result = run_cli("download", "--url", server.url("good"), "--dest", dest, "--no-verify", "--timeout", value)
        assert_one_line_error(result, 2, "--timeout", "from 0.1 to 3600")
    assert server.requests == {} and not dest.exists()
    with pytest.raises(UsageError, match="--timeout nan is not a number"):
        download(server.url("good"), dest, None, timeout=float("nan"))
    ok = run_cli("download", "--url", server.url("good"), "--dest", dest, *VERIFY, "--timeout", "3600")
    assert ok.returncode == 0 and sha256(dest) == EXCERPT_SHA256


def test_malformed_urls_are_refused_before_any_request(tmp_path):
    dest = tmp_path / "t.txt"
    for url in ("http://[::1", "http://127.0.0.1:abc/x", "http://127.0.0.1:99999/x", "http://", "http://a b/x"):
        result = run_cli("download", "--url", url, "--dest", dest, "--retries", "0")
        assert_one_line_error(result, 2, "malformed URL", url)
    assert not dest.exists() and list(tmp_path.iterdir()) == []


def test_a_dest_below_a_file_names_the_file_and_keeps_it(corpus, tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("mine")
    for dest in (notes / "t.txt", notes / "a" / "b" / "t.txt"):
        result = run_cli("download", "--url", corpus.as_uri(), "--dest", dest, *VERIFY)
        assert_one_line_error(result, 2, f"{notes} is a file, not a folder", "another --dest")
    assert notes.read_text() == "mine" and sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]
