"""Hub repository ids as --model: served from HF_HOME's cache (filled here by hand, offline)."""

from __future__ import annotations

import shutil
from pathlib import Path

import huggingface_hub.constants
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from radixserve.catalog.checkpoint_files import local_weight_files
from radixserve.catalog.hub import resolve_hub_model
from radixserve.lora.adapter import LoRALoadError, resolve_adapter_dir
from radixserve.model_loader.loader import load_model_source

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def offline_hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path / "hub"
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    return cache


def put_in_cache(cache: Path, repo: str, checkpoint: Path) -> None:
    """The layout huggingface_hub writes: models--ORG--NAME/{refs/main, snapshots/COMMIT/...}."""
    folder = cache / f"models--{repo.replace('/', '--')}"
    shutil.copytree(checkpoint, folder / "snapshots" / COMMIT)
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text(COMMIT)


def test_hub_repo_loads_from_the_cache(offline_hub: Path, tmp_path: Path) -> None:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2,
    )  # fmt: skip
    reference = LlamaForCausalLM(config)
    reference.save_pretrained(tmp_path / "ckpt", safe_serialization=True)
    put_in_cache(offline_hub, "acme/tiny-llama", tmp_path / "ckpt")
    expected = reference.state_dict()
    for spec in ("acme/tiny-llama", "hf://acme/tiny-llama"):
        source = load_model_source(spec)
        assert source.config.architecture == "LlamaForCausalLM"
        weights = dict(source.weights())
        assert torch.equal(
            weights["model.layers.0.mlp.up_proj.weight"],
            expected["model.layers.0.mlp.up_proj.weight"],
        )


def test_a_missing_repo_offline_is_a_clear_error(offline_hub: Path) -> None:
    with pytest.raises(ValueError, match="cannot get 'acme/missing'.*fill HF_HOME"):
        load_model_source("hf://acme/missing")


def test_an_existing_local_path_is_not_a_repo_id(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "org" / "name").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    assert resolve_hub_model("org/name") is None
    assert resolve_hub_model("builtin:smollm2-135m") is None
    assert resolve_hub_model("/abs/path/model.gguf") is None


def test_the_read_ahead_finds_a_cached_repo_and_never_fetches(
    offline_hub: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = LlamaConfig(
        vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1,
    )  # fmt: skip
    LlamaForCausalLM(config).save_pretrained(tmp_path / "ckpt", safe_serialization=True)
    put_in_cache(offline_hub, "acme/tiny-llama", tmp_path / "ckpt")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)  # cached_only holds
    files = local_weight_files("hf://acme/tiny-llama")
    assert [f.name for f in files] == ["model.safetensors"]
    assert files[0].is_file()
    assert resolve_hub_model("acme/missing", cached_only=True) is None
    assert local_weight_files("acme/missing") == []


def test_an_adapter_at_a_revision_resolves_to_that_snapshot(
    offline_hub: Path, tmp_path: Path
) -> None:
    """spec.loras' `source: hf://org/name@revision`: the snapshot the revision names, read from
    the cache (offline here: a missing one is a LoRALoadError, the API's 400)."""
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    folder = offline_hub / "models--acme--sql-lora"
    shutil.copytree(adapter, folder / "snapshots" / COMMIT)
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "v1").write_text(COMMIT)
    resolved = resolve_adapter_dir("hf://acme/sql-lora@v1")
    assert resolved == folder / "snapshots" / COMMIT
    with pytest.raises(LoRALoadError, match="acme/sql-lora"):
        resolve_adapter_dir("hf://acme/sql-lora@v2")
    with pytest.raises(LoRALoadError, match="acme/missing"):
        resolve_adapter_dir("hf://acme/missing")
