"""`charlm serve`'s start-up: settings under which it would refuse every client (or a host it cannot have) are one
line and exit 2 before it serves."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import pytest
from conftest import assert_one_line_error, run_cli, skip_without

pytestmark = skip_without("fastapi", reason="charlm serve needs the serve extra: pip install -e '.[test]'")


def test_an_address_this_machine_lacks_names_host(tiny_checkpoint):
    nonlocal_bind = Path("/proc/sys/net/ipv4/ip_nonlocal_bind")
    if nonlocal_bind.is_file() and nonlocal_bind.read_text().strip() == "1":
        pytest.skip("this machine binds any address (net.ipv4.ip_nonlocal_bind=1)")
    result = run_cli("serve", tiny_checkpoint, "--port", "0", "--host", "192.0.2.1")  # TEST-NET-1: nobody's
    assert_one_line_error(result, 2, "cannot listen on 192.0.2.1:0", "--host must be an address this machine has")
    assert "--port" not in result.stderr  # no port would help


@pytest.mark.parametrize(
    ("flags", "needles"),
    [
        (["--max-queue", "0"], ["--max-queue (0) cannot be below --max-n (16)"]),  # every completion would be a 429
        (["--max-queue", "7", "--max-n", "8"], ["--max-queue (7) cannot be below --max-n (8)"]),
        (["--unknown", "replace", "--replace-with", "€"], ["--replace-with '€' is not in the model's vocabulary"]),
    ],
)
def test_a_server_that_would_refuse_its_clients_does_not_start(tiny_checkpoint, flags, needles):
    # In this process, with a Ctrl-C after 60 s: a server that started after all would otherwise serve for ever; it
    # stops on the signal as it does in a terminal, and the exit code and message below tell that it had started.
    interrupt = threading.Timer(60, os.kill, (os.getpid(), signal.SIGINT))
    interrupt.start()
    try:
        result = run_cli("serve", tiny_checkpoint, "--port", "0", *flags)
    finally:
        interrupt.cancel()
    assert_one_line_error(result, 2, *needles)
