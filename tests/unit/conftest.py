import pytest

# Enabled when the structured-output engine (SamplingParams.json_schema/regex/ebnf/logit_bias)
# is merged: these drive those fields through the front door.
collect_ignore = ["test_openai_serving_structured.py"]


@pytest.fixture(scope="session")
def smollm2_tokenizer():
    """The bundled SmolLM2's tokenizer and chat template (no tool support in the template)."""
    from radixserve.model_loader.loader import load_tokenizer
    from radixserve.server_args import BUILTIN_SMOLLM2

    return load_tokenizer(BUILTIN_SMOLLM2)
