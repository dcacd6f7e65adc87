"""`radixserve serve`: --help derived from ServerArgs, and a busy port refused before loading."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import socket
import subprocess
import sys

import pytest

from radixserve.entrypoints.cli import main
from radixserve.server_args import ServerArgs, flag_of


def serve_help(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("COLUMNS", "10000")  # no wrapping (it breaks words at hyphens)
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exited:
        main(["serve", "--help"])
    assert exited.value.code == 0
    return " ".join(out.getvalue().split())


@pytest.mark.parametrize("field", dataclasses.fields(ServerArgs), ids=lambda f: f.name)
def test_help_shows_each_flags_description_and_default(
    field: dataclasses.Field, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = serve_help(monkeypatch)
    assert flag_of(field.name) in text
    description = " ".join(field.metadata["help"].split())
    assert description, f"{field.name} has no help text"
    assert description in text.replace("%%", "%")
    if field.default is not None and not isinstance(field.default, bool):
        shown = text[text.index(description) + len(description) :]
        assert shown.startswith(f" (default: {field.default})"), shown[:80]


def test_a_busy_port_fails_at_once_with_one_clear_line() -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "radixserve.entrypoints.cli", "serve"]
            + ["--host", "127.0.0.1", "--port", str(port)],
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert done.returncode == 1
    lines = (done.stdout + done.stderr).strip().splitlines()
    assert len(lines) == 1, lines  # no traceback, and nothing was loaded
    assert f"cannot listen on 127.0.0.1:{port}" in lines[0]
    assert "Address already in use" in lines[0] and "--port" in lines[0]
