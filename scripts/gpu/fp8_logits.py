"""Teacher-forced logits of an FP8 model against the same weights in bf16: `--quantization
fp8` quantizes the bf16 checkpoint at load, so the two runs hold one model, and both are fed
the same tokens (a prefill, a chunk on its cached prefix, then decode steps), each pass's
next-token logits compared by cosine similarity, row by row.

Batch 3 decodes through torch._scaled_mm with per-token activation scales, batch 1 through
the FP8 GEMV: both paths are measured. The same weights in float32 give the noise floor: how
far bf16 itself is from float32 on this model (random weights amplify rounding layer after
layer, so a random model's floor can sit far below a trained one's). Usage: python3 scripts/gpu/fp8_logits.py MODEL OUT.json
(MODEL e.g. random:llama-3-8b). Prints the summary; the JSON holds every pass's numbers.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "gpu"))
from test_fused_ops import model_passes  # noqa: E402

DECODE_STEPS = 32
BATCHES = {"bs3-scaled-mm": [5, 300, 700], "bs1-gemv": [400]}


def passes(
    model: str, lens: list[int], quantization: str | None, dtype: str = "bfloat16"
) -> list[torch.Tensor]:
    logits = model_passes(
        model,
        dtype,
        "cuda",
        "triton",
        True,
        lens,
        decode_steps=DECODE_STEPS,
        quantization=quantization,
        max_total_tokens=8192,
    )
    torch.cuda.empty_cache()
    return logits


def compare(test: list[torch.Tensor], reference: list[torch.Tensor]) -> dict:
    cosines = [
        torch.nn.functional.cosine_similarity(a.double(), b.double(), dim=-1)
        for a, b in zip(test, reference, strict=True)
    ]
    flat = torch.cat(cosines)
    agree = torch.cat(
        [(a.argmax(-1) == b.argmax(-1)).float() for a, b in zip(test, reference, strict=True)]
    )
    return {
        "rows": int(flat.numel()),
        "cosine_min": float(flat.min()),
        "cosine_mean": float(flat.mean()),
        "argmax_agreement": float(agree.mean()),
        "per_pass_min": [float(c.min()) for c in cosines],
    }


def main(model: str, out_path: str) -> None:
    summary = {"model": model, "decode_steps": DECODE_STEPS}
    for name, lens in BATCHES.items():
        bf16 = passes(model, lens, None)
        fp8 = passes(model, lens, "fp8")
        fp32 = passes(model, lens, None, "float32")
        summary[name] = {
            "fp8_vs_bf16": compare(fp8, bf16),
            "bf16_vs_fp32": compare(bf16, fp32),
            "fp8_vs_fp32": compare(fp8, fp32),
        }
        for pair, numbers in summary[name].items():
            print(
                f"=== {name} {pair}: {numbers['rows']} teacher-forced rows, cosine min "
                f"{numbers['cosine_min']:.5f} mean {numbers['cosine_mean']:.5f}, argmax "
                f"agreement {numbers['argmax_agreement']:.3f}"
            )
    Path(out_path).write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
