"""The KV pool of multi-head latent attention (MLA: DeepSeek V2/V3): one latent row per token.

MLA caches, per token and layer, the compressed KV latent (`kv_lora_rank` values, after the
kv_a_layernorm) and the rotated shared key part (`qk_rope_head_dim` values), not full K and V
heads: DeepSeek-V2-Lite stores 512 + 64 values where a 16-head model of its head size would
store 16 x (192 + 128). Every head's key and value are recovered from the latent by the
layer's kv_b_proj (expanded in prefill, absorbed into the query and output in decode), so the
pool is one buffer per layer, `[slots, 1, kv_lora_rank + qk_rope_head_dim]`.

It is a `TokenToKVPool` to everything that sizes, allocates or mirrors the pool generically
over its buffers: `k_buffers` holds the latent rows; `v_buffers` are views of their first
`kv_lora_rank` columns (the latent is the value before W_UV), so they cost no memory and a
copy made through them is a copy of the same bytes. Only the model's MLA layers write and read
it, through `set_latent` and `get_latent_buffer`.
"""

from __future__ import annotations

import torch

from radixserve.mem_cache.memory_pool import TokenToKVPool


class MLATokenToKVPool(TokenToKVPool):
    """Per-layer latent buffers [size + 1, 1, kv_lora_rank + rope_dim]; slot 0 is the padding
    target, as in the parent. Stored in the model dtype (an FP8 latent cache is not built)."""

    def __init__(
        self,
        size: int,
        num_layers: int,
        kv_lora_rank: int,
        rope_dim: int,
        dtype: torch.dtype,
        device: str | torch.device,
    ) -> None:
        if dtype.itemsize == 1:
            raise ValueError("an FP8 KV cache is not supported for MLA models (DeepSeek)")
        self.size = size
        self.num_layers = num_layers
        self.kv_lora_rank = kv_lora_rank
        self.rope_dim = rope_dim
        self.num_kv_heads = 1
        self.head_dim = kv_lora_rank + rope_dim
        self.dtype = dtype
        self.device = torch.device(device)
        shape = (size + 1, 1, self.head_dim)
        self.k_buffers = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v_buffers = [buffer[..., :kv_lora_rank] for buffer in self.k_buffers]
        self._scales = [(1.0, 1.0)] * num_layers

    def kv_buffers(self) -> list[torch.Tensor]:
        """Every device buffer, slot-major, each once (what a generic mirror of the pool
        copies): the latent rows; `v_buffers` are views into them."""
        return list(self.k_buffers)

    def get_latent_buffer(self, layer_id: int) -> torch.Tensor:
        """[slots, 1, kv_lora_rank + rope_dim]: latent columns first, then the rotated key."""
        return self.k_buffers[layer_id]

    def set_latent(
        self, layer_id: int, loc: torch.Tensor, latent: torch.Tensor, k_pe: torch.Tensor
    ) -> None:
        """Store this pass's normalised latents [n, kv_lora_rank] and rotated keys
        [n, rope_dim] at slots `loc` [n]."""
        buffer = self.k_buffers[layer_id]
        buffer[loc, 0, : self.kv_lora_rank] = latent.to(self.dtype)
        buffer[loc, 0, self.kv_lora_rank :] = k_pe.to(self.dtype)

    def set_kv_buffer(
        self, layer_id: int, loc: torch.Tensor, cache_k: torch.Tensor, cache_v: torch.Tensor
    ) -> None:
        """The latent row as a key ([n, 1, kv_lora_rank + rope_dim]); the value is its prefix,
        already stored with it."""
        self.k_buffers[layer_id][loc] = cache_k.to(self.dtype)

    def read_kv(
        self, layer_id: int, index: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        rows = self.k_buffers[layer_id][index].to(dtype)
        return rows, rows[..., : self.kv_lora_rank]

    @staticmethod
    def latent_bytes_per_token(
        num_layers: int, kv_lora_rank: int, rope_dim: int, dtype: torch.dtype
    ) -> int:
        """Device bytes one slot costs across all layers: sizes --max-total-tokens."""
        return num_layers * (kv_lora_rank + rope_dim) * dtype.itemsize
