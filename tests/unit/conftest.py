import pytest


@pytest.fixture(scope="session")
def smollm2_tokenizer():
    """The bundled SmolLM2's tokenizer and chat template (no tool support in the template)."""
    from radixserve.model_loader.loader import load_tokenizer
    from radixserve.server_args import BUILTIN_SMOLLM2

    return load_tokenizer(BUILTIN_SMOLLM2)
