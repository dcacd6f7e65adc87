"""LoRA adapters on the GPU fast path: the Triton shrink/expand kernels inside captured decode
graphs, overlap on, float32, a tiny random Llama with three PEFT adapters of ranks 4, 8 and 16
and the base mixed in one batch: greedy output identical to PEFT's (CPU) for every row; base
rows alone replay the graphs captured without the LoRA kernels."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():  # before importing PEFT and transformers' models
    pytest.skip("needs CUDA", allow_module_level=True)
pytest.importorskip("peft")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
from engine_harness import greedy, make_scheduler, random_prompts  # noqa: E402
from lora_adapters import ADAPTERS, peft_greedy, save_adapter  # noqa: E402

from radixserve.boundary import TokenizedGenerateReqInput  # noqa: E402
from radixserve.model_loader.loader import build_hf_reference, load_model_source  # noqa: E402

NEW = 16


def run(scheduler, jobs) -> list[list[int]]:
    for i, (name, prompt) in enumerate(jobs):
        scheduler.handle_generate_request(
            TokenizedGenerateReqInput(
                rid=f"r{i}", input_ids=prompt, sampling_params=greedy(NEW), lora_name=name
            )
        )
    ids: dict[str, list[int]] = {f"r{i}": [] for i in range(len(jobs))}
    while scheduler.has_work():
        scheduler.step()
        for out in scheduler.pop_outputs():
            ids[out.rid].extend(out.new_token_ids)
    return [ids[f"r{i}"] for i in range(len(jobs))]


def mixed_jobs(tmp_path, make_prompts, **kw):
    """The three adapters and the base over `make_prompts(vocab)`, each prompt twice, on a
    CUDA scheduler (float32, triton, graphs) with `kw`: the scheduler, the jobs, PEFT's tokens
    for each and the reference model. Random weights are drawn on the device they are for (a
    CUDA draw is not the CPU's): the reference holds the very weights the GPU worker serves,
    moved to the CPU."""
    source = load_model_source("random:tiny-llama", device="cuda", dtype="float32")
    hf = build_hf_reference(source).cpu()
    dirs = {
        name: save_adapter(hf, tmp_path / name, rank, alpha, targets, seed)
        for seed, (name, rank, alpha, targets) in enumerate(ADAPTERS)
    }
    prompts = make_prompts(source.config.vocab_size)
    names = [None, *dirs]
    jobs = [(names[i % len(names)], p) for i, p in enumerate(prompts * 2)]
    expected = [peft_greedy(hf, dirs.get(n), p, NEW) for n, p in jobs]
    scheduler = make_scheduler(
        "random:tiny-llama",
        source,
        device="cuda",
        dtype="float32",
        attention_backend="triton",
        lora_modules=[f"{n}={p}" for n, p in dirs.items()],
        max_loras=3,
        **kw,
    )
    return scheduler, jobs, expected, hf


def test_mixed_adapters_in_cuda_graphs_match_peft(tmp_path):
    scheduler, jobs, expected, hf = mixed_jobs(
        tmp_path, lambda vocab: random_prompts(6, vocab, 5, 60, seed=3)
    )
    prompts = [p for _, p in jobs[:6]]
    graphs = scheduler.worker.model_runner.cuda_graph_runner
    assert graphs is not None and scheduler.overlap
    replays = {True: count_replays(graphs.lora_graphs), False: count_replays(graphs.graphs)}
    assert run(scheduler, jobs) == expected
    assert sum(replays[True].values()) > 0
    # base rows alone replay the graphs captured without any LoRA kernel, and stay PEFT's
    base_jobs = [(None, p) for p in prompts]
    used = {k: sum(v.values()) for k, v in replays.items()}
    assert run(scheduler, base_jobs) == [peft_greedy(hf, None, p, NEW) for _, p in base_jobs]
    assert sum(replays[True].values()) == used[True]
    assert sum(replays[False].values()) > used[False]


@pytest.mark.parametrize("method", ["ngram", "draft"])
def test_speculation_with_mixed_adapters_in_cuda_graphs_matches_peft(tmp_path, method):
    """Speculation beside LoRA on the GPU: verify steps carry each row's adapter slot through
    the graphs, a draft model proposes without adapters, and every row keeps PEFT's tokens."""
    spec = {"speculative_method": method, "speculative_num_tokens": 4}
    if method == "draft":
        spec["speculative_draft_model"] = "random:tiny-llama"

    def copy_heavy(vocab: int) -> list[list[int]]:  # a span repeated: the n-gram finds it
        return [p + p[: len(p) // 2] + p for p in random_prompts(4, vocab, 10, 40, seed=5)]

    scheduler, jobs, expected, _ = mixed_jobs(tmp_path, copy_heavy, **spec)
    graphs = scheduler.worker.model_runner.cuda_graph_runner
    assert graphs is not None and scheduler.overlap
    assert run(scheduler, jobs) == expected
    info = scheduler.get_server_info()
    assert info["forward_steps_by_mode"]["verify"] > 0 and info["spec_accepted_tokens"] > 0
    assert info["protected_size"] == 0


def count_replays(graphs: dict) -> dict[int, int]:
    """Wrap each graph of `graphs` (by size) so its replays are counted: the counts."""
    counts = dict.fromkeys(graphs, 0)

    class Counted:
        def __init__(self, bs, graph):
            self.bs, self.graph = bs, graph

        def replay(self):
            counts[self.bs] += 1
            self.graph.replay()

    for bs, graph in list(graphs.items()):
        graphs[bs] = Counted(bs, graph)
    return counts


def random_lora_linear(sizes, rows: int, slots: int, seed: int):
    """A bf16 base projection of K = 4096 with random rank-16 adapters in `slots` slots and
    the `LoRABatch` of `rows` rows it reads: (batch, base, layer)."""
    from radixserve.layers.linear import Linear
    from radixserve.layers.lora_linear import LoRABatch, LoRALinear

    torch.manual_seed(seed)
    batch = LoRABatch(torch.device("cuda"), rows, slots)
    base = Linear(4096, sum(sizes), bias=False).cuda().bfloat16()
    layer = LoRALinear(base, 4096, sizes, slots, 16, batch, torch.bfloat16)
    layer.lora_a.copy_(torch.randn(layer.lora_a.shape) * 0.02)
    layer.lora_b.copy_(torch.randn(layer.lora_b.shape) * 0.02)
    return batch, base, layer


def epilogue_reference(x, weight, layer, sizes, gated, slot) -> torch.Tensor:
    """float64: x · Wᵀ plus each sub-projection's adapter term of `slot`, then the activation."""
    rank = layer.max_rank
    y = x.double() @ weight.double().t()
    if slot >= 0:
        offset = 0
        for i, size in enumerate(sizes):
            a = layer.lora_a[slot, i * rank : (i + 1) * rank].double()
            b = layer.lora_b[slot, offset : offset + size].double()
            y[:, offset : offset + size] += (x.double() @ a.t()) @ b.t()
            offset += size
    if gated:
        half = y.shape[1] // 2
        y = torch.nn.functional.silu(y[:, :half]) * y[:, half:]
    return y


@pytest.mark.parametrize(
    "sizes,gated", [([4096, 1024, 1024], False), ([4096], False), ([14336, 14336], True)]
)
def test_batch1_bf16_gemv_epilogue_in_a_replayed_graph(sizes, gated):
    """A batch-1 bf16 row: the one-row shrink, then the adapter's expand in the base GEMV's
    epilogue for fused q/k/v, one projection and the gated pair (the MLP's activation): against
    float64, for each slot and the base, in a captured graph replayed after the step's slot
    changed."""
    batch, base, layer = random_lora_linear(sizes, 8, 3, seed=0)
    x = torch.randn(1, 4096, device="cuda", dtype=torch.bfloat16)
    run = layer.silu_and_mul if gated else layer

    def rel(got: torch.Tensor, slot: int) -> float:
        ref = epilogue_reference(x, base.weight, layer, sizes, gated, slot)
        return float((got.double() - ref).norm() / ref.norm())

    with torch.no_grad():
        batch.prepare([0], [1], always=True)
        assert rel(run(x), 0) < 1e-2
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = run(x)
        for slot in (2, -1, 1):
            batch.prepare([slot], [1], always=True)
            graph.replay()
            torch.cuda.synchronize()
            assert rel(out, slot) < 1e-2, slot
        # the adapter term is far above bf16 rounding: a result without it fails the check
        assert rel(out, -1) > 0.05


@pytest.mark.parametrize("sizes,gated", [([4096, 1024, 1024], False), ([14336, 14336], True)])
def test_batch1_norm_and_shrink_in_one_launch_in_a_replayed_graph(sizes, gated):
    """Batch 1, bf16, the 8B shapes: the norm before q/k/v (or gate/up) and the projection's
    shrink in one launch (`norm_and_project`, as the decoder layer takes it) give the norm's
    and the projection's values as the norm's own kernel and the one-row shrink do, the
    residual sum too, in a captured graph replayed for other slots and the base."""
    from radixserve.layers.layernorm import RMSNorm
    from radixserve.models.llama import LlamaDecoderLayer

    batch, base, layer = random_lora_linear(sizes, 8, 3, seed=1)
    k = 4096
    norm = RMSNorm(k, eps=1e-5).cuda().bfloat16()
    norm.weight.data.copy_(1 + 0.1 * torch.randn(k, device="cuda"))
    x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
    residual = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
    run = layer.silu_and_mul if gated else layer

    def fused() -> tuple[torch.Tensor, ...]:
        normed, summed = LlamaDecoderLayer.norm_before(norm, layer, x, residual)
        assert layer._shrunk_by_norm is not None  # the fused launch was taken
        return run(normed), normed, summed

    def separate() -> tuple[torch.Tensor, ...]:
        normed, summed = norm(x.clone(), residual.clone())  # in place on copies
        return run(normed), normed, summed

    def rel(a: torch.Tensor, b: torch.Tensor) -> float:
        return float((a.double() - b.double()).norm() / b.double().norm())

    with torch.no_grad():
        batch.prepare([0], [1], always=True)
        graph = torch.cuda.CUDAGraph()
        fused()  # compiled outside the capture
        with torch.cuda.graph(graph):
            captured = fused()
        outputs = {}
        for slot in (2, -1, 1):
            batch.prepare([slot], [1], always=True)
            graph.replay()
            torch.cuda.synchronize()
            want = separate()
            assert rel(captured[0], want[0]) < 5e-3, slot
            assert rel(captured[1], want[1]) < 1e-3 and torch.equal(captured[2], want[2]), slot
            outputs[slot] = captured[0].clone()
        # the adapter term is far above bf16 rounding: a shrink that was lost would show
        assert rel(outputs[1], outputs[-1]) > 0.05


@pytest.mark.parametrize("sizes,gated", [([4096, 1024, 1024], False), ([14336, 14336], True)])
def test_decode_shrink_beside_the_base_product_in_a_replayed_graph(sizes, gated):
    """64 bf16 rows over 8 adapters and the base at the 8B shapes: with each shrink forked onto
    the batch's shrink stream beside cuBLAS's base product (and joined before the expand), a
    captured graph replayed for new rows and new slots gives exactly the values of the same
    kernels run eagerly, in line on one stream, the activation included for gate/up."""
    rows, k, slots = 64, 4096, 8
    batch, base, layer = random_lora_linear(sizes, rows, slots, seed=2)
    assert batch.shrink_stream is not None
    run = layer.silu_and_mul if gated else layer
    x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
    gen = torch.Generator().manual_seed(3)

    with torch.no_grad():
        batch.prepare(torch.randint(-1, slots, (rows,), generator=gen).tolist(), [1] * rows)
        run(x)  # compiled outside the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = run(x)
        outputs = []
        for _ in range(3):
            row_slots = torch.randint(-1, slots, (rows,), generator=gen).tolist()
            batch.prepare(row_slots, [1] * rows)
            x.copy_(torch.randn(rows, k, generator=gen).bfloat16())
            graph.replay()
            torch.cuda.synchronize()
            want = run(x)  # eager: in line
            torch.cuda.synchronize()
            assert torch.equal(captured, want)
            outputs.append(captured.clone())
        batch.prepare([-1] * rows, [1] * rows, always=True)
        graph.replay()
        plain = base.silu_and_mul(x) if gated else base(x)
        # the adapters' terms are far above bf16 rounding: a shrink that was lost would show
        assert float((captured.double() - plain.double()).norm() / plain.double().norm()) < 1e-6
        assert float((outputs[-1].double() - plain.double()).norm() / plain.double().norm()) > 0.02


@pytest.mark.parametrize("pattern", ["random", "one_adapter", "each_its_own"])
def test_grouped_decode_kernels_at_8b_shapes(pattern):
    """The decode shrink and expand on 64 bf16 rows grouped by slot (16-row blocks, the 8B
    gate/up's 28,672 columns and K 4096 on `shrink_config`'s and `expand_config`'s tiles: 128
    columns, 8 splits) against float64:
    random slots with base rows, every row one adapter, every row its own adapter (64 slots)."""
    from radixserve.kernels import lora as lora_kernels

    gen = torch.Generator().manual_seed(1)
    rows, k, sizes, rank = 64, 4096, [14336, 14336], 16
    slots = 64 if pattern == "each_its_own" else 8
    row_slots = {
        "random": torch.randint(-1, slots, (rows,), generator=gen).tolist(),
        "one_adapter": [3] * rows,
        "each_its_own": torch.randperm(rows, generator=gen).tolist(),
    }[pattern]
    table = torch.tensor(lora_kernels.decode_blocks(row_slots, slots), dtype=torch.int32)
    layout = lora_kernels.Layout(
        seg_starts=torch.arange(rows + 1, dtype=torch.int32, device="cuda"),
        seg_slots=torch.tensor(row_slots, dtype=torch.int32, device="cuda"),
        max_seg_len=1,
        blocks=table.view(-1, 1 + lora_kernels.DECODE_BLOCK_M).cuda(),
    )
    x = torch.randn(rows, k, generator=gen).bfloat16().cuda()
    a = (torch.randn(slots, 2 * rank, k, generator=gen) * 0.02).bfloat16().cuda()
    b = (torch.randn(slots, sum(sizes), rank, generator=gen) * 0.02).bfloat16().cuda()
    # small: y's bf16 rounding stays well below the adapters' terms (~0.1)
    base = (torch.randn(rows, sum(sizes), generator=gen) * 0.05).bfloat16().cuda()
    y = base.clone()
    s = lora_kernels.shrink(x, a, layout)
    lora_kernels.expand(y, s, b, layout, sizes)
    want = base.double()
    for row, slot in enumerate(row_slots):
        if slot >= 0:
            for i, (start, size) in enumerate(((0, sizes[0]), (sizes[0], sizes[1]))):
                a_i = a[slot, i * rank : (i + 1) * rank].double()
                b_i = b[slot, start : start + size].double()
                want[row, start : start + size] += (x[row].double() @ a_i.t()) @ b_i.t()
    delta = y.double() - base.double()
    want_delta = want - base.double()
    assert float((delta - want_delta).norm() / want_delta.norm()) < 1e-2
    base_rows = torch.tensor([s < 0 for s in row_slots], device="cuda")
    assert torch.equal(y[base_rows], base[base_rows])
