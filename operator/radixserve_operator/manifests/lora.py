"""spec.loras with placement ``all``: the adapter list as a ConfigMap the worker pods mount.

The list lives outside the pod template so that a change of spec.loras alone changes no pod
(no restart): new pods read the ConfigMap's current list at start (``--lora-modules-file``).
"""

from __future__ import annotations

from typing import Any

from radixserve_operator.manifests.meta import Owner, object_meta
from radixserve_operator.spec import LoRAAdapter

LORA_MOUNT = "/etc/radixserve/loras"
LORA_MODULES_KEY = "modules"
LORA_MODULES_FILE = f"{LORA_MOUNT}/{LORA_MODULES_KEY}"
MODEL_CACHE_MOUNT = "/models/cache"


def lora_config_map_name(owner: Owner) -> str:
    return f"{owner.name}-loras"


def adapter_path(adapter: LoRAAdapter) -> str:
    """What the worker loads: a Hub repo id as is (the worker finds it in the Hub cache on the
    model-cache volume), else the path on that volume."""
    if adapter.source.startswith("hf://"):
        return adapter.source
    return f"{MODEL_CACHE_MOUNT}/{adapter.source}"


def lora_modules(adapters: tuple[LoRAAdapter, ...]) -> dict[str, str]:
    """name -> the path the worker loads, in spec order."""
    return {adapter.name: adapter_path(adapter) for adapter in adapters}


def build_lora_config_map(owner: Owner, adapters: tuple[LoRAAdapter, ...]) -> dict[str, Any]:
    lines = [f"{name}={path}\n" for name, path in lora_modules(adapters).items()]
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": object_meta(owner, lora_config_map_name(owner)),
        "data": {LORA_MODULES_KEY: "".join(lines)},
    }
