"""Attention backend name -> class. A new backend is a new module plus one line here.

Names only, as "module:Class" strings: the CLI and the front end read the choices without
importing torch or any kernel; `layers/attention/registry.py` imports a backend's module when
it creates one.
"""

from __future__ import annotations

BACKENDS: dict[str, str] = {
    "torch_native": "radixserve.layers.attention.torch_native_backend:TorchNativeAttnBackend",
    "triton": "radixserve.layers.attention.triton_backend:TritonAttnBackend",
    "flashinfer": "radixserve.layers.attention.flashinfer_backend:FlashInferAttnBackend",
}
# what --attention-backend accepts: a registered backend, or auto (see resolve_backend_name)
BACKEND_CHOICES: tuple[str, ...] = ("auto", *BACKENDS)
