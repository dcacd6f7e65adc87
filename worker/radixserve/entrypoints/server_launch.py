"""`radixserve serve`'s start: claim the port, start the scheduler process, then serve HTTP.

Apart from `http_server` so that the scheduler process is spawned before this process imports
its HTTP stack (aiohttp and the OpenAI layer: 0.5 s warm, more on a node whose page cache is
cold). The scheduler's imports, the longest phase of a start, begin that much earlier; the
HTTP stack is imported on a thread while the model loads.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import importlib
import logging
import signal
import socket

from radixserve.frontend.engine import Engine
from radixserve.metrics.startup import process_started_at
from radixserve.server_args import ServerArgs

logger = logging.getLogger(__name__)


def bind_listener(host: str, port: int) -> socket.socket:
    """The server's listening socket, bound before anything slow starts: a port in use fails
    in a second, not after the model has loaded, and nobody can take it meanwhile."""
    family, _, _, _, address = socket.getaddrinfo(
        host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    return socket.create_server(address, family=family)


def run_server(server_args: ServerArgs) -> None:
    """Claim the port, load the model (blocking) while the HTTP stack imports, then serve on a
    fresh event loop. Exits non-zero (SystemExit) when the scheduler process died."""
    try:
        listener = bind_listener(server_args.host, server_args.port)
    except OSError as exc:
        logger.error(
            "cannot listen on %s:%d: %s; is another server running there? choose another --port",
            server_args.host,
            server_args.port,
            exc.strerror or exc,
        )
        raise SystemExit(1) from None
    # Until the loop's own handler takes over, SIGTERM during the model load exits cleanly
    # (the Engine stops the half-started scheduler on the way out).
    signal.signal(signal.SIGTERM, _exit_during_startup)
    with listener, concurrent.futures.ThreadPoolExecutor(1) as pool:
        http_server = pool.submit(importlib.import_module, "radixserve.frontend.http_server")
        engine = Engine(
            server_args,
            event_loop_thread=False,
            enforce_queue_limit=True,
            process_started_at=process_started_at(),
        )
        try:
            status = asyncio.run(http_server.result().serve(engine, server_args, listener))
        finally:
            engine.shutdown()
    if status:  # the scheduler process died: a non-zero exit, so that the pod restarts
        raise SystemExit(status)


def _exit_during_startup(signum: int, frame: object) -> None:
    logger.info("SIGTERM while loading the model; exiting")
    raise SystemExit(0)
