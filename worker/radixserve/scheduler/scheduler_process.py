"""The scheduler process: its sockets, its loop, and tensor-parallel ranks.

`run_scheduler_process` is the entry point the front end spawns. It loads the model, builds the
model worker and hands it to the scheduling policy (scheduler.py), then loops: messages in from
the front end's socket, one `Scheduler.step()`, outputs and stats out. With `--tp-size N` the
process the front end starts is rank 0: it starts ranks 1..N-1, and passes on what it receives
each step, so every rank makes the same scheduling decisions and runs its shard of every batch.
"""

from __future__ import annotations

import contextlib
import ctypes
import faulthandler
import importlib
import logging
import multiprocessing
import multiprocessing.process
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import torch

from radixserve.boundary import (
    SCHEDULER_IMPORTED,
    BatchReqOutput,
    GrammarsReadyReq,
    PoolingParams,
    PortArgs,
    StopRanksReq,
    TokenizedGenerateReqInput,
)
from radixserve.catalog.checkpoint_files import hf_directory_config
from radixserve.catalog.servable import check_servable
from radixserve.distributed.parallel_state import destroy_tensor_parallel, init_tensor_parallel
from radixserve.gc_pauses import freeze_startup_heap
from radixserve.layers.attention.registry import library_to_import_early
from radixserve.logging_config import configure_logging
from radixserve.mem_cache.kv_events import KVEventPublisher
from radixserve.metrics.startup import StartupPhases
from radixserve.model_loader.loader import ModelSource, derived_hf_config, load_model_source_for
from radixserve.model_loader.tokenizer import frontend_tokenizer_dir
from radixserve.read_ahead import record_startup_files
from radixserve.sampling.sampling_params import SamplingParams
from radixserve.scheduler.scheduler import Scheduler, ServedModel
from radixserve.scheduler.tp_worker import ModelWorker
from radixserve.server_args import BUILTIN_SMOLLM2, ServerArgs
from radixserve.utils import resolve_device

logger = logging.getLogger(__name__)

# the longest warm-up prompt: enough to exercise multi-block prefill kernels, cheap on a CPU
WARMUP_PROMPT_TOKENS = 160

# how soon the scheduler retries reaching the front end's output socket (bound after ready)
SEND_RECONNECT_MS = 5

# an idle scheduler loop reports at least this often (what /ready's liveness check reads)
HEARTBEAT_S = 1.0

# the exit status of a scheduler process its watchdog ended (EX_SOFTWARE)
WATCHDOG_EXIT_CODE = 70

# prctl's option: a signal for this process when its parent dies (linux/prctl.h)
PR_SET_PDEATHSIG = 1

# while only grammar compiles or adapter reads are pending, the loop waits up to this long for a
# message instead of spinning
BACKGROUND_WAIT_MS = 2


def warm_up(scheduler: Scheduler) -> None:
    """Serve a few requests of every kind of pass before the worker reports ready, so that
    kernels are compiled and planned now (Triton's on first sight of a shape, FlashInfer's
    JIT), not at a user's first request: prefills of several lengths up to a full chunk, a
    prefix-cache hit, batched decode, greedy and sampled rows with penalties and logprobs.
    Every rank of a tensor-parallel group runs the same requests in step. The cache, the
    counters and the device timeline are reset afterwards: nothing of it shows in metrics."""
    vocab, context = scheduler.model.vocab_size, scheduler.context_len
    length = max(2, min(WARMUP_PROMPT_TOKENS, scheduler.max_total_tokens // 8, context // 2))
    prompt = [1 + i % (vocab - 1) for i in range(length)]
    # a full prefill chunk and a quarter of one: the GEMM shapes of long prompts (cuBLAS loads
    # a kernel at its first use of a shape class), each its own pass, no prefix shared
    longest = min(
        scheduler.server_args.chunked_prefill_size, scheduler.max_total_tokens // 4, context // 2
    )
    long_prompts = [
        [2 + k % (vocab - 2)] + [1 + i % (vocab - 1) for i in range(1, n)]
        for k, n in enumerate((longest, longest // 4))
        if n > length
    ]
    greedy = SamplingParams(max_new_tokens=4, temperature=0.0, ignore_eos=True)
    sampled = SamplingParams(
        max_new_tokens=4, temperature=0.8, top_p=0.9, top_k=20, min_p=0.05,
        frequency_penalty=0.5, repetition_penalty=1.1, ignore_eos=True, seed=0,
    )  # fmt: skip
    waves = [
        [
            (prompt, greedy, False),
            (prompt[:1], greedy, False),
            (prompt[: length // 3], greedy, True),
        ],
        [(prompt[: length // 2] + [2, 3], sampled, True), (prompt[1:], greedy, False)],
        *([(ids, greedy, False)] for ids in long_prompts),
    ]
    pooling = PoolingParams() if scheduler.model.task.pools else None
    for number, wave in enumerate(waves):
        for index, (ids, params, logprob) in enumerate(wave):
            request = TokenizedGenerateReqInput(
                f"warmup-{number}-{index}", ids, params, return_logprob=logprob, top_logprobs_num=2
            )
            if pooling is not None:  # the same prefills, pooled: there is no decode
                request.pooling = pooling
                request.sampling_params = SamplingParams(max_new_tokens=0)
                request.return_logprob = False
            scheduler.handle_generate_request(request)
        while scheduler.has_work():
            scheduler.step()
        errors = [o.finished_reason for o in scheduler.pop_outputs() if _failed(o.finished_reason)]
        if errors:
            raise RuntimeError(f"warm-up request failed: {errors[0]}")
    scheduler.flush_cache()
    scheduler.reset_statistics()


def _failed(reason: dict | None) -> bool:
    return reason is not None and reason.get("type") == "error"


def check_model_config(server_args: ServerArgs) -> None:
    """The front end checks a checkpoint directory's config.json itself, torch-free; the forms
    whose config only the loader reads (a GGUF file, `random:`) are checked here, before any
    weights load, with the same error naming what is not served."""
    model = server_args.model
    if model == BUILTIN_SMOLLM2 or hf_directory_config(model) is not None:
        return
    check_servable(derived_hf_config(model).to_dict(), server_args.quantization)


def build_scheduler(
    server_args: ServerArgs,
    source: ModelSource | None = None,
    startup: StartupPhases | None = None,
) -> Scheduler:
    """Load the model (unless `source` is given), put it on a model worker, and give that
    worker to the scheduling policy: what a scheduler process (or an in-process test) runs.
    `startup` collects the phases' times."""
    startup = startup or StartupPhases()
    if source is None:
        with startup.timed("model_setup"):
            source = load_model_source_for(server_args)
    worker = ModelWorker(server_args, source, startup)
    model = ServedModel(
        context_len=source.config.context_len,
        vocab_size=source.config.vocab_size,
        eos_token_ids=frozenset(source.config.eos_token_ids),
        tokenizer=source.tokenizer,
        description=source.description,
        matmul_parameters=source.config.matmul_parameters,
        task=worker.model_runner.task,
    )
    if model.task.pools:
        logger.info("serving --task %s (%s)", model.task.task, model.task.reason)
    return Scheduler(server_args, worker, model)


def run_scheduler_process(
    server_args: ServerArgs,
    port_args: PortArgs,
    ready_conn: Any,
    tp_rank: int = 0,
    dist_init_method: str | None = None,
    spawned_at: float | None = None,
) -> None:
    """Entry point of a scheduler process (multiprocessing 'spawn' target).

    With `--tp-size N`, the process the front end starts is rank 0: it starts ranks 1..N-1 as
    its own children, talks to the front end, and passes on what it receives each step, so that
    every rank makes the same scheduling decisions and runs its shard of every batch.
    `spawned_at` (the parent's time.time() at spawn) times the imports that ran before this.
    """
    import zmq

    # first thing: a front end (or rank 0) that dies, even by SIGKILL, takes this process along
    # (PR_SET_PDEATHSIG)
    parent = die_with_parent()
    startup = StartupPhases()
    if spawned_at is not None:
        startup.add("imports", time.time() - spawned_at)
    if ready_conn is not None:
        ready_conn.send(SCHEDULER_IMPORTED)  # the front end's weight read-ahead starts now
    if resolve_device(server_args.device) == "cuda":
        _start_cuda_context(tp_rank)
    if library := library_to_import_early(
        server_args.attention_backend, resolve_device(server_args.device)
    ):
        import_on_thread(library)
    if ready_conn is not None:
        with startup.timed("model_check"):
            if not _model_approved(ready_conn):
                return  # the front end refused the model and says why; nothing to add
    configure_logging(server_args.log_level, server_args.log_format, f"scheduler{tp_rank or ''}")
    peers: list[multiprocessing.process.BaseProcess] = []
    try:
        if tp_rank == 0:
            with startup.timed("model_check"):
                check_model_config(server_args)
        if server_args.tp_size > 1:
            if tp_rank == 0:
                dist_init_method = f"tcp://127.0.0.1:{_free_port()}"
                peers = _start_peer_ranks(server_args, port_args, dist_init_method)
            device = resolve_device(server_args.device)
            init_tensor_parallel(
                tp_rank,
                server_args.tp_size,
                dist_init_method,
                torch.device(f"cuda:{tp_rank}") if device == "cuda" else torch.device("cpu"),
            )
        scheduler = build_scheduler(server_args, startup=startup)
        if tp_rank == 0 and server_args.kv_events_endpoint:
            # bound here, so that a port in use fails the start with its reason
            scheduler.publish_kv_events(
                KVEventPublisher(
                    server_args.kv_events_endpoint,
                    server_args.kv_events_replay_endpoint,
                    server_args.kv_events_block_size,
                    server_args.kv_events_topic,
                )
            )
        if scheduler.worker.device.type == "cuda":  # the CPU's torch code compiles nothing
            with startup.timed("kernel_warmup"):
                warm_up(scheduler)
        if tp_rank == 0:  # what this start read, for the next one's read-ahead (read_ahead.py)
            record_startup_files()
        logger.info("model loaded; KV capacity %d tokens", scheduler.max_total_tokens)
    except Exception as exc:  # report any load failure to the parent, then exit
        logger.exception("scheduler failed to start")
        if ready_conn is not None:
            ready_conn.send({"status": "error", "message": f"{type(exc).__name__}: {exc}"})
        for peer in peers:
            peer.terminate()
        return
    # every rank steps: none may stop for a full collection over the start-up heap
    freeze_startup_heap()
    ctx = zmq.Context(1)
    if tp_rank != 0:
        if scheduler.grammar_cache is not None:
            # no time limit of its own: rank 0's verdict on each compile decides for every rank
            scheduler.grammar_cache.timeout = None
        from_first = ctx.socket(zmq.PULL)
        from_first.connect(port_args.rank_ipc_name(tp_rank))
        _follow_first_rank(scheduler, from_first, parent)
        from_first.close(linger=0)
        ctx.term()
        return
    recv_sock = ctx.socket(zmq.PULL)
    recv_sock.bind(port_args.scheduler_input_ipc_name)
    send_sock = ctx.socket(zmq.PUSH)
    # The front end binds its end only once this process has reported ready, so this connect
    # first fails; ZMQ retries every RECONNECT_IVL (100 ms by default), which the first
    # reply after /ready then waited out (~170 ms TTFT against ~15 ms).
    send_sock.setsockopt(zmq.RECONNECT_IVL, SEND_RECONNECT_MS)
    send_sock.connect(port_args.tokenizer_ipc_name)
    to_ranks = []
    for rank in range(1, server_args.tp_size):
        to_ranks.append(ctx.socket(zmq.PUSH))
        to_ranks[-1].bind(port_args.rank_ipc_name(rank))
    ready_conn.send(
        {
            "status": "ready",
            "max_total_tokens": scheduler.max_total_tokens,
            "max_running_requests": scheduler.max_running_requests,
            "context_len": scheduler.context_len,
            "vocab_size": scheduler.model.vocab_size,
            "model_description": scheduler.model.description,
            "tokenizer_dir": frontend_tokenizer_dir(scheduler.model.tokenizer),
            "task": scheduler.model.task.to_dict(),
            "hidden_size": scheduler.worker.model_runner.model_config.hidden_size,
            # what it serves after start-up (an adapter of --lora-modules-file may be left out)
            "lora_adapters": scheduler.lora.served() if scheduler.lora is not None else {},
            **scheduler.worker.describe(),
            "startup_phases": startup.seconds,
        }
    )
    watchdog = None
    if server_args.watchdog_timeout > 0:
        watchdog = Watchdog(server_args.watchdog_timeout)
        watchdog.start()
    _serve(scheduler, recv_sock, send_sock, to_ranks, parent, watchdog)
    if watchdog is not None:
        watchdog.stop()
    if scheduler.kv_events is not None:
        scheduler.kv_events.close()
    scheduler.tree_cache.close()
    front_end_gone = os.getppid() != parent
    if peers and not front_end_gone:
        _stop_peer_ranks(peers, to_ranks)
    # outputs for a front end that is gone must not hold the exit
    for sock in (recv_sock, send_sock, *to_ranks):
        sock.close(linger=0)
    ctx.term()
    if front_end_gone:
        # Nobody is left to serve: ranks 1..N-1 die with this process (their parent-death
        # signal), and the interpreter's teardown of torch and the model (seconds of CPU) is
        # skipped, so that the devices are free at once.
        logger.info("the front end is gone; exiting")
        _flush_logs()
        os._exit(0)
    destroy_tensor_parallel()


def die_with_parent(sig: int = signal.SIGKILL) -> int:
    """Have the kernel send `sig` to this process the moment its parent dies (Linux
    PR_SET_PDEATHSIG), and return the parent's pid for the loop's own check. SIGKILL: a parent
    that died unexpectedly leaves nothing to finish (its requests are lost with it), and the
    signal arrives while the parent is still exiting, before this process could tell it from
    the SIGTERM of an orderly stop; ranks 1..N-1 follow the same way, even from inside a
    collective. A parent already gone before the request took effect is caught by comparing
    with the pid multiprocessing recorded. The kernel's notion of the parent is the thread
    that started this process: the front end spawns from its main thread. Without prctl the
    loop's check of the parent pid, every iteration, is the watch."""
    spawner = multiprocessing.parent_process()
    parent = spawner.pid if spawner is not None and spawner.pid else os.getppid()
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
                logger.warning("prctl(PR_SET_PDEATHSIG) failed: errno %d", ctypes.get_errno())
        except (OSError, AttributeError) as exc:
            logger.warning("cannot ask to die with the parent process: %s", exc)
    if os.getppid() != parent:
        os.kill(os.getpid(), sig)
    return parent


def _start_cuda_context(device_index: int) -> None:
    """Create this rank's CUDA context on a thread, beside the wait for the front end's model
    check: context creation is seconds of a cold start, and the model setup that follows
    needs it first (a refused model's process exits with the context unused)."""
    threading.Thread(
        target=lambda: torch.empty(1, device=f"cuda:{device_index}"),
        name="cuda-context",
        daemon=True,
    ).start()


def import_on_thread(module: str) -> threading.Thread:
    """Import `module` on a daemon thread, beside the model's setup: its file reads overlap the
    setup's work, and the import the backend does later finds the module loaded (or waits for
    this thread to finish it). A failure here is left for that import to raise and report."""

    def run() -> None:
        try:
            importlib.import_module(module)
        except Exception:  # noqa: BLE001 - the backend's own import reports it
            logger.debug("importing %s ahead failed; the backend's import will say why", module)

    thread = threading.Thread(target=run, name=f"import-{module}", daemon=True)
    thread.start()
    return thread


def _model_approved(conn: Any) -> bool:
    """Wait for the front end's verdict on the model (`engine.approve_model`): it checks the
    model while this process imports, so that nothing loads for a model it refuses."""
    try:
        return conn.recv() == "load"
    except EOFError:  # the front end stopped or refused
        return False


def _serve(
    scheduler: Scheduler,
    recv_sock: Any,
    send_sock: Any,
    to_ranks: list[Any],
    parent: int,
    watchdog: Watchdog | None = None,
) -> None:
    """Rank 0's loop, until SIGTERM (the front end stopping it) or the front end's death.

    The front end's death ends this process at once: the kernel's PR_SET_PDEATHSIG
    (`die_with_parent`), and where that is missing the loop's comparison of its parent's pid
    every iteration (a syscall of well under a microsecond). Each
    iteration feeds the `watchdog` (a time and whether work was pending): a step wedged for
    `--watchdog-timeout` seconds with work pending ends the process.

    Each iteration's messages go to ranks 1..N-1 (`to_ranks`) before rank 0 applies them: a
    send, never a wait, so the host's critical path between two steps has no round trip
    between ranks (a gloo object broadcast took ~0.9 ms on a 2-core CPU); the devices stay in
    step through their own collectives. Grammar compiles end at different times on each rank,
    so rank 0's say decides when a constrained request is admitted (a GrammarsReadyReq among
    the messages; the scheduler's own polling is off with ranks).

    SIGTERM only sets a flag: the step in progress finishes, so that with --tp-size > 1 every
    rank is between collectives when the others are told to stop."""
    import zmq

    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    idle_reported = True
    last_report = time.monotonic()
    while not stopping.is_set():
        if os.getppid() != parent:
            unfinished = len(scheduler.reqs_by_rid)
            logger.warning("the front end is gone; exiting with %d requests unfinished", unfinished)
            return
        busy = scheduler.has_work()
        # block (bounded, to notice a dead parent) only when there is nothing to run
        if not busy:
            recv_sock.poll(timeout=200)
        if scheduler.waiting_only_in_background():
            # grammars compile and adapters are read on other threads: wait a little for them
            # or a message, not spin
            recv_sock.poll(timeout=BACKGROUND_WAIT_MS)
        messages = []
        while True:
            try:
                messages.append(recv_sock.recv_pyobj(zmq.NOBLOCK))
            except zmq.Again:
                break
        if to_ranks and (ready := scheduler.ready_grammar_rids()):
            messages.append(GrammarsReadyReq(ready, scheduler.grammar_failures(ready)))
        for sock in to_ranks:
            sock.send_pyobj(messages)
        for msg in messages:
            reply = scheduler.dispatch(msg)
            if reply is not None:
                send_sock.send_pyobj(reply)
        for reply in scheduler.pop_replies():  # adapter loads read meanwhile
            send_sock.send_pyobj(reply)
        if watchdog is not None:
            watchdog.feed(busy or bool(messages))
        ran = scheduler.step()
        outputs = scheduler.pop_outputs()
        # an idle loop still reports now and then: the front end's readiness reads it as the
        # loop being alive (a wedged loop goes silent)
        heartbeat = time.monotonic() - last_report >= HEARTBEAT_S
        if ran or outputs or not idle_reported or heartbeat:
            send_sock.send_pyobj(BatchReqOutput(outputs, scheduler.pop_stats()))
            # compiles and reads still pending change no output: they must not report every 2 ms
            idle_reported = not ran and (
                not scheduler.has_work() or scheduler.waiting_only_in_background()
            )
            last_report = time.monotonic()


class Watchdog:
    """Ends a scheduler process whose loop is wedged: no iteration has completed for `timeout`
    seconds while work was pending. It dumps every thread's stack to stderr (the log) and exits
    with WATCHDOG_EXIT_CODE, so the front end, seeing its scheduler die, exits too and the pod
    restarts (a wedged GPU or a deadlock does not come back by itself).

    The loop calls `feed` once per iteration: two stores, no lock (a daemon thread reads them
    every `interval` seconds; a torn read only delays the verdict by one look). `clock`, `dump`
    and `exit` are there for tests."""

    def __init__(
        self,
        timeout: float,
        *,
        interval: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        dump: Callable[[], None] | None = None,
        exit: Callable[[int], None] = os._exit,
    ) -> None:
        self.timeout = timeout
        self.interval = interval if interval is not None else max(0.01, min(1.0, timeout / 4))
        self.clock = clock
        self.dump = dump or _dump_all_stacks
        self.exit = exit
        self.last_step = clock()
        self.pending = False
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def feed(self, pending: bool) -> None:
        """An iteration is under way (the one before it completed); `pending`: it has work."""
        self.last_step = self.clock()
        self.pending = pending

    def check(self) -> bool:
        """One look: fire (dump, then exit) if work is pending and no iteration completed for
        longer than the timeout. True when it fired."""
        pending, stalled = self.pending, self.clock() - self.last_step
        if not pending or stalled <= self.timeout:
            return False
        logger.critical(
            "watchdog: the scheduler loop has not completed a step for %.0fs with work pending "
            "(--watchdog-timeout %.0fs); dumping every thread's stack and exiting",
            stalled,
            self.timeout,
        )
        self.dump()
        self.exit(WATCHDOG_EXIT_CODE)
        return True

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="scheduler-watchdog", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()

    def _run(self) -> None:
        while not self._stopped.wait(self.interval):
            if self.check():
                return


def _dump_all_stacks() -> None:
    _flush_logs()
    faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
    sys.stderr.flush()


def _flush_logs() -> None:
    """What the log handlers hold, written out before an os._exit (which flushes nothing)."""
    for handler in logging.getLogger().handlers:
        with contextlib.suppress(Exception):
            handler.flush()
    with contextlib.suppress(Exception):
        sys.stderr.flush()


def _follow_first_rank(scheduler: Scheduler, from_first: Any, parent: int) -> None:
    """Ranks 1..N-1: apply rank 0's messages and step in lockstep with it (one message list
    per rank-0 iteration, at least five a second); outputs are rank 0's job. Rank 0 ends this
    with a StopRanksReq; a rank 0 that died instead is noticed as a changed parent (and by
    the kernel's PR_SET_PDEATHSIG, which also ends a rank blocked in a collective)."""
    while True:
        if os.getppid() != parent:
            logger.info("rank 0 is gone; exiting")
            return
        if not from_first.poll(timeout=1000):
            continue
        messages = from_first.recv_pyobj()
        if any(isinstance(msg, StopRanksReq) for msg in messages):
            destroy_tensor_parallel()
            return
        for msg in messages:
            scheduler.dispatch(msg)
        scheduler.step()
        scheduler.pop_outputs()


def _stop_peer_ranks(peers: list[multiprocessing.process.BaseProcess], to_ranks: list[Any]) -> None:
    """Tell ranks 1..N-1 to stop and wait for them, so that they take their NCCL
    communicators down while rank 0's store still answers (otherwise each logs a stack of
    'TCPStore ... Connection was likely closed' warnings)."""
    for sock in to_ranks:
        sock.send_pyobj([StopRanksReq()])
    for peer in peers:
        peer.join(timeout=5)
        if peer.is_alive():
            peer.terminate()


def _start_peer_ranks(
    server_args: ServerArgs, port_args: PortArgs, dist_init_method: str
) -> list[multiprocessing.process.BaseProcess]:
    context = multiprocessing.get_context("spawn")
    peers = []
    for rank in range(1, server_args.tp_size):
        peer = context.Process(
            target=run_scheduler_process,
            args=(server_args, port_args, None, rank, dist_init_method),
            name=f"radixserve-scheduler-tp{rank}",
            daemon=True,  # ends with rank 0
        )
        peer.start()
        peers.append(peer)
    return peers


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
