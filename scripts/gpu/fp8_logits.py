"""Teacher-forced logits of an FP8 model against the same weights in bf16: `--quantization
fp8` quantizes the bf16 checkpoint at load, so the two runs hold one model, and both are fed
the same tokens (a prefill, a chunk on its cached prefix, then decode steps), each pass's
next-token logits compared by cosine similarity, row by row.

Batch 3 decodes through torch._scaled_mm with per-token activation scales, batch 1 through
the FP8 GEMV: both paths are measured. Usage: python3 scripts/gpu/fp8_logits.py MODEL OUT.json
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


def passes(model: str, lens: list[int], quantization: str | None) -> list[torch.Tensor]:
    logits = model_passes(
        model,
        "bfloat16",
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


def main(model: str, out_path: str) -> None:
    summary = {"model": model, "decode_steps": DECODE_STEPS}
    for name, lens in BATCHES.items():
        bf16 = passes(model, lens, None)
        fp8 = passes(model, lens, "fp8")
        cosines = [
            torch.nn.functional.cosine_similarity(a.double(), b.double(), dim=-1)
            for a, b in zip(fp8, bf16, strict=True)
        ]
        flat = torch.cat(cosines)
        agree = torch.cat(
            [(a.argmax(-1) == b.argmax(-1)).float() for a, b in zip(fp8, bf16, strict=True)]
        )
        summary[name] = {
            "rows": int(flat.numel()),
            "cosine_min": float(flat.min()),
            "cosine_mean": float(flat.mean()),
            "argmax_agreement": float(agree.mean()),
            "per_pass_min": [float(c.min()) for c in cosines],
        }
        print(
            f"=== {name}: {flat.numel()} teacher-forced rows, cosine min "
            f"{flat.min():.5f} mean {flat.mean():.5f}, argmax agreement {agree.mean():.3f} "
            f"({'PASS' if flat.min() >= 0.99 else 'FAIL'} at >= 0.99)"
        )
    Path(out_path).write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
