"""Logging for every worker process: plain lines for people, JSON objects for log pipelines.

`--log-format json` makes each line one JSON object (time, level, logger, process, message and
any `extra` fields, such as a request log's), like the operator's `--log-format json`. The
front end and each scheduler process call `configure_logging` first thing, so every line the
worker writes has the same shape; Python warnings are routed through it too. This module
imports nothing of radixserve, so every process may call it before anything else is loaded.
"""

from __future__ import annotations

import logging
import sys

from pythonjsonlogger.json import JsonFormatter

LOG_FORMATS = ("plain", "json")


def configure_logging(level: str, log_format: str = "plain", process: str = "frontend") -> None:
    """Replace the root logger's handlers with one stderr handler in `log_format`; `process`
    names the writer (frontend, scheduler, scheduler1, ...)."""
    handler = logging.StreamHandler(sys.stderr)
    if log_format == "json":
        handler.setFormatter(
            JsonFormatter(
                "%(asctime)s %(levelname)s %(name)s %(message)s",
                rename_fields={"asctime": "time", "levelname": "level", "name": "logger"},
                static_fields={"process": process},
            )
        )
    elif log_format == "plain":
        handler.setFormatter(
            logging.Formatter(f"%(asctime)s {process} %(name)s %(levelname)s %(message)s")
        )
    else:
        raise ValueError(f"log format must be one of {LOG_FORMATS}, got {log_format!r}")
    root = logging.getLogger()
    for old in root.handlers[:]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    logging.captureWarnings(True)
