"""Every Triton kernel of the worker, each module with its launch wrappers, and their shared
plumbing (`triton_support`). Layers call kernels; kernels import no layer."""
