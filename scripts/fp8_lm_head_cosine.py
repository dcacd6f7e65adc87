"""Would an FP8 LM head keep the logits? The bundled SmolLM2-135M-Instruct in float32
(transformers on the GGUF file), 1,024 teacher-forced positions of this repository's README and
architecture page: its logits against the same final hidden states times the LM head quantized
to e4m3 with one scale a vocabulary row (weight-only, as the batch-1 GEMV would stream it), with
the activations quantized too (W8A8, as torch._scaled_mm takes batches), and in bf16. Prints
each one's cosine (min, mean over the positions) and argmax agreement with float32.

Usage (CPU, a minute): .venv/bin/python scripts/fp8_lm_head_cosine.py
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM, AutoTokenizer

from radixserve.kernels.fp8_quant import quantize_rows
from radixserve.model_loader.tokenizer import bundled_gguf_path

ROOT = Path(__file__).resolve().parents[1]


@torch.no_grad()
def main() -> None:
    gguf = bundled_gguf_path()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32
    )
    pages = ("README.md", "docs/architecture.md")
    text = "".join((ROOT / page).read_text()[:6000] for page in pages)
    ids = tokenizer(text, return_tensors="pt").input_ids[:, :1024]
    out = model(ids, output_hidden_states=True)
    hidden, logits = out.hidden_states[-1][0], out.logits[0]
    head = model.lm_head.weight.float()
    values, scales = quantize_rows(head)
    fp8_head = values.float() * scales[:, None]
    x_values, x_scales = quantize_rows(hidden)
    for name, approx in (
        ("fp8 weight-only", hidden @ fp8_head.T),
        ("fp8 weights and activations", (x_values.float() * x_scales[:, None]) @ fp8_head.T),
        ("bf16", (hidden.bfloat16() @ head.bfloat16().T).float()),
    ):
        cosine = F.cosine_similarity(approx, logits, dim=-1)
        agree = (approx.argmax(-1) == logits.argmax(-1)).float().mean()
        print(
            f"{name:<28} cosine min {cosine.min():.5f} mean {cosine.mean():.5f}, "
            f"argmax agreement {agree:.3f} over {len(cosine)} positions"
        )


if __name__ == "__main__":
    main()
