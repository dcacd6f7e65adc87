"""Runs a check script of this folder under Triton's CPU interpreter and returns its result.

In a subprocess because TRITON_INTERPRET must be set before any kernel module is imported and
must not leak into the rest of the test session; the script prints its result as the last line,
in JSON."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any


def run_interpreted(script_name: str) -> Any:
    script = Path(__file__).with_name(script_name)
    proc = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "TRITON_INTERPRET": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])
