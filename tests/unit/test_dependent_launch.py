"""The kernels launched as programmatic dependents (`triton_support.dependent_launch`) keep stream
order: compiled for Hopper, nothing a kernel touches before its grid-dependency wait is written
by the kernels before it. Most touch nothing before it; a few read constants or the step's
inputs first (EARLY_READS, the cases `triton_support.wait_for_prior_kernel` allows), and those
early accesses must be loads computed from those arguments only. A kernel that read or wrote
anything else early could see the kernel before it half done, and only on the GPU, only
sometimes. Compiling needs no GPU (Triton ships ptxas)."""

from __future__ import annotations

import re

import pytest

triton = pytest.importorskip("triton")

from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from radixserve.kernels import (  # noqa: E402
    argmax,
    decode_attention,
    fused_moe,
    fused_ops,
    gemv,
    lora,
    mla_absorb,
    mla_decode,
    mla_rope_store,
    moe_gemv,
    triton_support,
)

HOPPER = GPUTarget("cuda", 90, 32)

# the routed down GEMV at DeepSeek-V2-Lite's batch 1 (top 6, the shared experts' output added)
V2_LITE_DOWN = {
    "TOP_K": 6,
    "HAS_SCALE": False,
    "HAS_BIAS": False,
    "HAS_ADD": True,
    "MXFP4": False,
    "BLOCK_P": 8,
    "BLOCK_N": 1,
    "BLOCK_K": 128,
    "NUM_STAGES": 1,
}


def rotary_store_kv_case(qk_norm: bool) -> tuple:
    """The rotary + KV store kernel's entry of KERNELS, with or without the q/k norms in it."""
    return (
        fused_ops._rotary_store_kv_kernel,
        {"Positions": "i64", "Loc": "i64", "Cos": "fp32", "Sin": "fp32"},
        {"k_inv_scale", "v_inv_scale", "norm_eps"},
        {
            "HALF": 64,
            "BLOCK_H": 1,
            "BLOCK_HALF": 64,
            "FP8_CACHE": False,
            "QK_NORM": qk_norm,
            "UNIT_OFFSET": False,
        },
    )


# kernel, its pointers' element types (others bf16), its float scalars (others i32), its
# constexprs as the decode step of a Llama-3-8B shape launches them
KERNELS = {
    "gemv (FP8, gated)": (
        gemv._gemv_kernel,
        {"W": "fp8e4nv", "Bias": "fp8e4nv", "Scale": "fp32"},
        set(),
        # pipelined: its cp.async prologue must come after the wait too
        {
            "HAS_BIAS": False,
            "HAS_SCALE": True,
            "GATED": True,
            "BLOCK_N": 4,
            "BLOCK_K": 1024,
            "NUM_STAGES": 3,
            "LORA": False,
            "LORA_BLOCK_R": 16,
        },
    ),
    "gemv (bf16)": (
        gemv._gemv_kernel,
        {},
        set(),
        {
            "HAS_BIAS": True,
            "HAS_SCALE": False,
            "GATED": False,
            "BLOCK_N": 2,
            "BLOCK_K": 2048,
            "NUM_STAGES": 1,
            "LORA": False,
            "LORA_BLOCK_R": 16,
        },
    ),
    # an adapter's expand in the epilogue (batch 1 with LoRA): B and the slot read early, s
    # (the shrink's output) after the K loop
    "gemv (bf16, gated, LoRA)": (
        gemv._gemv_kernel,
        {"LoraS": "fp32", "LoraSlot": "i32"},
        set(),
        {
            "HAS_BIAS": False,
            "HAS_SCALE": False,
            "GATED": True,
            "BLOCK_N": 2,
            "BLOCK_K": 2048,
            "NUM_STAGES": 1,
            "LORA": True,
            "LORA_BLOCK_R": 16,
        },
    ),
    "moe routing (top-k softmax)": (
        fused_moe._topk_softmax_kernel,
        {"TopkWeights": "fp32", "TopkIds": "i32"},
        set(),
        {
            "TOP_K": 8,
            "RENORMALIZE": True,
            "ROUND_TO_LOGITS_DTYPE": True,
            "BLOCK_E": 128,
            "BLOCK_K": 8,
        },
    ),
    # the grouped GEMMs' top-k sum with DeepSeek's shared experts added: all written before it
    "moe top-k sum (+ shared)": (
        fused_moe._topk_sum_kernel,
        {},
        set(),
        {"TOP_K": 6, "BLOCK": 1024, "HAS_ADD": True},
    ),
    # the routed MoE GEMV of batch 1: everything it reads hangs on the routing, written by the
    # kernel before, so nothing is read early
    "moe gate_up gemv (bf16, SiLU)": (
        moe_gemv._gate_up_gemv_kernel,
        {"TopkIds": "i32", "ExpertUse": "i64", "Scale": "fp32"},
        {"alpha", "limit"},
        {
            "TOP_K": 8,
            "ACT": 0,
            "HAS_SCALE": False,
            "HAS_BIAS": False,
            "MXFP4": False,
            "BLOCK_N": 1,
            "BLOCK_K": 1024,
            "BLOCK_P": 8,
            "NUM_STAGES": 1,
        },
    ),
    "moe gate_up gemv (MXFP4, biased SwiGLU)": (
        moe_gemv._gate_up_gemv_kernel,
        {"W": "u8", "Scale": "u8", "TopkIds": "i32", "ExpertUse": "i64"},
        {"alpha", "limit"},
        {
            "TOP_K": 4,
            "ACT": 2,
            "HAS_SCALE": False,
            "HAS_BIAS": True,
            "MXFP4": True,
            "BLOCK_N": 1,
            "BLOCK_K": 1024,
            "BLOCK_P": 4,
            "NUM_STAGES": 1,
        },
    ),
    "moe down gemv (FP8)": (
        moe_gemv._down_gemv_kernel,
        {"W": "fp8e4nv", "Scale": "fp32", "TopkIds": "i32", "TopkWeights": "fp32"},
        set(),
        {
            "TOP_K": 8,
            "HAS_SCALE": True,
            "HAS_BIAS": False,
            "HAS_ADD": False,
            "MXFP4": False,
            "BLOCK_P": 8,
            "BLOCK_N": 2,
            "BLOCK_K": 256,
            "NUM_STAGES": 1,
        },
    ),
    "moe down gemv (MXFP4, biased, top 6)": (
        moe_gemv._down_gemv_kernel,
        {"W": "u8", "Scale": "u8", "TopkIds": "i32", "TopkWeights": "fp32"},
        set(),
        {
            "TOP_K": 6,
            "HAS_SCALE": False,
            "HAS_BIAS": True,
            "HAS_ADD": False,
            "MXFP4": True,
            "BLOCK_P": 8,
            "BLOCK_N": 2,
            "BLOCK_K": 256,
            "NUM_STAGES": 1,
        },
    ),
    "moe down gemv (bf16, top 6, the shared experts added)": (
        moe_gemv._down_gemv_kernel,
        {"TopkIds": "i32", "TopkWeights": "fp32"},
        set(),
        V2_LITE_DOWN,
    ),
    # the K loops software-pipelined (`GemvTiles` stages > 1): cp.async fills start after the wait
    "moe gate_up gemv (bf16, pipelined)": (
        moe_gemv._gate_up_gemv_kernel,
        {"TopkIds": "i32", "ExpertUse": "i64", "Scale": "fp32"},
        {"alpha", "limit"},
        {
            "TOP_K": 6,
            "ACT": 0,
            "HAS_SCALE": False,
            "HAS_BIAS": False,
            "MXFP4": False,
            "BLOCK_N": 1,
            "BLOCK_K": 512,
            "BLOCK_P": 8,
            "NUM_STAGES": 3,
        },
    ),
    "moe down gemv (bf16, pipelined)": (
        moe_gemv._down_gemv_kernel,
        {"TopkIds": "i32", "TopkWeights": "fp32"},
        set(),
        V2_LITE_DOWN | {"NUM_STAGES": 3},
    ),
    "mla absorbed projection (per-head gemv)": (
        mla_absorb._per_head_gemv_kernel,
        {},
        set(),
        {"BLOCK_M": 1, "BLOCK_K": 512, "BLOCK_N": mla_absorb.block_n(512, 128)},
    ),
    "moe routing (noaux_tc, grouped)": (
        fused_moe._noaux_tc_topk_kernel,
        {"Logits": "fp32", "Bias": "fp32", "TopkWeights": "fp32", "TopkIds": "i32"},
        {"scaling"},
        {
            "N_GROUP": 8,
            "GROUP_SIZE": 32,
            "TOPK_GROUP": 4,
            "TOP_K": 8,
            "RENORMALIZE": True,
            "BLOCK_G": 8,
            "BLOCK_GS": 32,
            "BLOCK_K": 8,
        },
    ),
    "moe router gemv (float32 router)": (
        moe_gemv._router_gemv_kernel,
        {"W": "fp32", "Out": "fp32"},
        set(),
        {"BLOCK_E": moe_gemv.ROUTER_BLOCK_E, "BLOCK_K": moe_gemv.ROUTER_BLOCK_K},
    ),
    "rms_norm (with residual)": (
        fused_ops._rms_norm_kernel,
        {},
        {"eps"},
        {"HAS_RESIDUAL": True, "UNIT_OFFSET": False, "BLOCK_M": 1, "BLOCK_N": 4096},
    ),
    "act_and_mul": (fused_ops._act_and_mul_kernel, {}, set(), {"GELU": False, "BLOCK": 1024}),
    "rotary_store_kv": rotary_store_kv_case(qk_norm=False),
    # Qwen3's q/k norm in the same launch: the norms' weights are constants, read early too
    "rotary_store_kv (q/k norm)": rotary_store_kv_case(qk_norm=True),
    "decode split": (
        decode_attention._decode_grouped_split_kernel,
        {
            "Req_to_token": "i32",
            "Req_pool_indices": "i64",
            "Seq_lens": "i64",
            "Mid_O": "fp32",
            "Mid_Lse": "fp32",
        },
        {"sm_scale", "logit_cap", "v_scale"},
        {
            "GROUP_SIZE": 4,
            "HEAD_DIM": 128,
            "BLOCK_D": 128,
            "BLOCK_H": 16,
            "BLOCK_N": 64,
            "MIN_SPLIT": 64,
            "DOT_PRECISION": "tf32",
            "HAS_CAP": False,
        },
    ),
    "argmax chunks": (
        argmax._chunk_max_kernel,
        {"X": "fp32", "ChunkMax": "fp32", "ChunkIdx": "i64"},
        set(),
        {"BLOCK": 2048},
    ),
    "argmax rows": (
        argmax._row_max_kernel,
        {"ChunkMax": "fp32", "ChunkIdx": "i64", "Out": "i64", "Table": "i64", "TableIdx": "i64"},
        set(),
        {"SCATTER": True, "BLOCK": 64},
    ),
    "mla rope_store": (
        mla_rope_store._mla_rope_store_kernel,
        {"Positions": "i64", "Cos": "fp32", "Sin": "fp32", "Loc": "i64"},
        {"eps"},
        {
            "NOPE": 128,
            "LATENT": 512,
            "HALF": 32,
            "BLOCK_C": 512,
            "BLOCK_HALF": 32,
            "BLOCK_H": 16,
            "INTERLEAVED": True,
        },
    ),
    "mla decode split": (
        mla_decode._mla_decode_split_kernel,
        {
            "Req_to_token": "i32",
            "Req_pool_indices": "i64",
            "Seq_lens": "i64",
            "Mid_O": "fp32",
            "Mid_Lse": "fp32",
        },
        {"sm_scale"},
        {
            "LATENT": 512,
            "ROPE": 64,
            "BLOCK_C": 512,
            "BLOCK_R": 64,
            "BLOCK_H": 16,
            "BLOCK_N": 32,
            "MIN_SPLIT": 64,
            "DOT_PRECISION": "tf32",
        },
    ),
    "decode merge": (
        decode_attention._decode_merge_splits_kernel,
        {"Mid_O": "fp32", "Mid_Lse": "fp32", "Seq_lens": "i64"},
        set(),
        {"HEAD_DIM": 128, "BLOCK_D": 128, "BLOCK_S": 64, "FEW_SPLITS": 16, "MIN_SPLIT": 64},
    ),
    "lora shrink (decode)": (
        lora._shrink_kernel,
        {"Out": "fp32", "SegStart": "i32", "SegSlot": "i32", "Blocks": "i32"},
        set(),
        {"GROUPED": True, "BLOCK_M": 16, "BLOCK_R": 16, "BLOCK_K": 256, "PRECISION": "tf32"},
    ),
    "lora shrink (one row)": (
        lora._shrink_row_kernel,
        {"Out": "fp32", "SegSlot": "i32"},
        set(),
        {"BLOCK_K": 4096},
    ),
    # batch 1: the norm before q/k/v or gate/up with the projection's LoRA shrink
    # (norm_and_shrink), and before a MoE router with the router
    "norm + projection (one row, LoRA shrink)": (
        fused_ops._norm_project_row_kernel,
        {"Out": "fp32", "Slot": "i32"},
        {"eps"},
        {
            "HAS_RESIDUAL": True,
            "UNIT_OFFSET": False,
            "HAS_SLOT": True,
            "HAS_BIAS": False,
            "BLOCK_K": 4096,
        },
    ),
    "norm + projection (one row, biased router)": (
        fused_ops._norm_project_row_kernel,
        {"Slot": "i32"},
        {"eps"},
        {
            "HAS_RESIDUAL": True,
            "UNIT_OFFSET": False,
            "HAS_SLOT": False,
            "HAS_BIAS": True,
            "BLOCK_K": 4096,
        },
    ),
    "lora expand (decode)": (
        lora._expand_kernel,
        {"S": "fp32", "SegStart": "i32", "SegSlot": "i32", "Blocks": "i32"},
        set(),
        {
            "GROUPED": True,
            "BLOCK_M": 16,
            "BLOCK_N": 256,
            "BLOCK_R": 16,
            "MAX_SPLITS": 16,
            "PRECISION": "tf32",
        },
    ),
    "lora shrink (prefill)": (
        lora._shrink_kernel,
        {"Out": "fp32", "SegStart": "i32", "SegSlot": "i32", "Blocks": "i32"},
        set(),
        {"GROUPED": False, "BLOCK_M": 16, "BLOCK_R": 64, "BLOCK_K": 64, "PRECISION": "tf32"},
    ),
}

# the arguments a kernel reads before its wait: constants and the step's inputs
EARLY_READS = {
    "gemv (FP8, gated)": {"Scale"},
    "gemv (bf16)": {"Bias"},
    # the row's adapter slot, a step input, and its B rows
    "gemv (bf16, gated, LoRA)": {"LoraSlot", "LoraB"},
    "rms_norm (with residual)": {"W"},
    "rotary_store_kv": {"Positions", "Loc", "Cos", "Sin"},
    "rotary_store_kv (q/k norm)": {"Positions", "Loc", "Cos", "Sin", "Q_Norm", "K_Norm"},
    "decode split": {"Seq_lens", "Req_pool_indices", "Req_to_token"},
    "decode merge": {"Seq_lens"},
    "mla decode split": {"Seq_lens", "Req_pool_indices", "Req_to_token"},
    "mla absorbed projection (per-head gemv)": {"W"},  # the head's weight slice, a constant
    "moe routing (noaux_tc, grouped)": {"Bias"},  # the correction bias: a constant
    # the token's position and slot; the latent norm's weight and the rotary tables
    "mla rope_store": {"Positions", "Loc", "Norm_weight", "Cos", "Sin"},
    # the pass's adapter layout (its segments, or its decode block table); the expand's B
    "lora shrink (decode)": {"Blocks"},
    "lora shrink (one row)": {"SegSlot", "A"},  # the row's slot and its A row
    # the norm's weight, the projection's row (and bias), the LoRA row's slot
    "norm + projection (one row, LoRA shrink)": {"W", "P", "Slot"},
    "norm + projection (one row, biased router)": {"W", "P", "Bias"},
    "lora expand (decode)": {"Blocks", "B"},
    "lora shrink (prefill)": {"SegStart", "SegSlot"},
}
# kernels that let the next kernel launch before their own wait (LAUNCH_NEXT_FIRST): the next
# one may then start while the one before still runs
LAUNCH_NEXT_FIRST = {
    "rotary_store_kv",
    "rotary_store_kv (q/k norm)",
    "lora shrink (one row)",
    "norm + projection (one row, LoRA shrink)",
    "norm + projection (one row, biased router)",
}

# the GEMVs' sizes (E: the router's experts, M: rows); other capitalised arguments are pointers
UPPERCASE_SCALARS = {"N", "K", "E", "M"}
MEMORY_ACCESS = re.compile(r"^\s*(@%p\d+\s+)?(ld\.global|st\.global|cp\.async|atom\.global|red\.)")


def signature_of(name: str) -> dict[str, str]:
    kernel, pointer_types, floats, constexprs = KERNELS[name]
    signature = {}
    for arg in kernel.arg_names:
        if arg in constexprs or arg == "PDL":
            signature[arg] = "constexpr"
        elif arg[0].isupper() and arg not in UPPERCASE_SCALARS:
            signature[arg] = "*" + pointer_types.get(arg, "bf16")
        else:
            signature[arg] = "fp32" if arg in floats else "i32"
    return signature


def hopper_ptx(name: str, pdl: bool) -> list[str]:
    kernel, _, _, constexprs = KERNELS[name]
    signature = signature_of(name)
    # pointers and sizes divisible by 16, as a launch on these shapes specializes them (the
    # GEMV's loads vectorize, and its pipelined loop then issues cp.async)
    attrs = {
        (i,): [["tt.divisibility", 16]]
        for i, arg in enumerate(kernel.arg_names)
        if signature[arg] == "i32" or signature[arg].startswith("*")
    }
    source = ASTSource(
        fn=kernel, signature=signature, constexprs={**constexprs, "PDL": pdl}, attrs=attrs
    )
    return triton.compile(source, target=HOPPER, options={"num_warps": 4}).asm["ptx"].splitlines()


def pointer_arguments(ptx: list[str], line: int, arguments: list[str]) -> set[str]:
    """The kernel's pointer arguments that the address of the access at ptx[line] is computed
    from (through the loads, arithmetic and moves that define its registers)."""
    definitions: dict[str, str] = {}
    for text in ptx[:line]:
        instruction = re.sub(r"^\s*@%\w+\s+", "", text).strip()  # without its predicate
        registers = re.findall(r"%\w+", instruction)
        if registers and not instruction.startswith("st."):  # PTX writes the first operand
            definitions.setdefault(registers[0], instruction)
    found: set[str] = set()
    pending = re.findall(r"\[\s*(%\w+)", ptx[line])
    seen: set[str] = set()
    while pending:
        register = pending.pop()
        if register in seen or register not in definitions:
            continue
        seen.add(register)
        text = definitions[register]
        if param := re.search(r"ld\.param\.b64\s+%\w+,\s*\[\w+_param_(\d+)\]", text):
            found.add(arguments[int(param[1])])
        pending += re.findall(r"%\w+", text)[1:]
    return found


@pytest.mark.parametrize("name", KERNELS)
def test_a_dependent_kernel_waits_before_it_touches_memory(name: str) -> None:
    ptx = hopper_ptx(name, pdl=True)
    waits = [i for i, line in enumerate(ptx) if "griddepcontrol.wait" in line]
    accesses = [i for i, line in enumerate(ptx) if MEMORY_ACCESS.match(line)]
    assert waits and accesses, name
    early = [i for i in accesses if i < waits[0]]
    allowed = EARLY_READS.get(name, set())
    assert all("ld.global" in ptx[i] for i in early), [ptx[i] for i in early]
    signature = signature_of(name)
    arguments = [arg for arg in KERNELS[name][0].arg_names if signature[arg] != "constexpr"]
    read = set().union(*(pointer_arguments(ptx, i, arguments) for i in early))
    assert read == allowed, (name, read)
    assert any(i > waits[0] for i in accesses), name  # the rest of its work comes after


PIPELINED = [
    name for name, (*_, constexprs) in KERNELS.items() if constexprs.get("NUM_STAGES", 1) > 1
]


@pytest.mark.parametrize("name", PIPELINED)
def test_a_pipelined_loop_fills_shared_memory_asynchronously(name: str) -> None:
    """A K loop asked for stages > 1 is really pipelined (Triton pipelines a loop whose loads
    feed no dot only when the loop asks): its loads become cp.async copies into shared memory,
    and every one of them is issued after the grid-dependency wait."""
    ptx = hopper_ptx(name, pdl=True)
    wait = next(i for i, line in enumerate(ptx) if "griddepcontrol.wait" in line)
    copies = [i for i, line in enumerate(ptx) if re.search(r"\bcp\.async\.c[ag]\b", line)]
    assert copies, name
    assert min(copies) > wait, name


@pytest.mark.parametrize("name", KERNELS)
def test_a_kernel_launches_the_next_where_it_says(name: str) -> None:
    """After its wait, but for the short kernels named in LAUNCH_NEXT_FIRST."""
    ptx = hopper_ptx(name, pdl=True)
    wait = next(i for i, line in enumerate(ptx) if "griddepcontrol.wait" in line)
    launches = [i for i, line in enumerate(ptx) if "griddepcontrol.launch_dependents" in line]
    assert len(launches) == 1, name
    assert (launches[0] < wait) == (name in LAUNCH_NEXT_FIRST), name


@pytest.mark.parametrize("name", ["gemv (bf16)", "decode merge"])
def test_launched_plainly_a_kernel_has_no_grid_dependency_control(name: str) -> None:
    """Before Hopper (and on the CPU's interpreter) the same kernels compile without it."""
    assert not any("griddepcontrol" in line for line in hopper_ptx(name, pdl=False))


def test_only_hopper_and_newer_cuda_devices_launch_dependents(monkeypatch) -> None:
    import torch

    cpu = torch.zeros(1)
    assert triton_support.dependent_launch(cpu) == {"PDL": False, "launch_pdl": False}

    class FakeCudaTensor:
        is_cuda = True
        device = torch.device("cuda", 0)

    for capability, expected in [((8, 0), False), ((8, 9), False), ((9, 0), True), ((10, 0), True)]:
        triton_support._has_dependent_launch.cache_clear()
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index, c=capability: c)
        assert triton_support.dependent_launch(FakeCudaTensor()) == {
            "PDL": expected,
            "launch_pdl": expected,
        }, capability
    triton_support._has_dependent_launch.cache_clear()
