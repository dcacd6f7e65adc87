import logging

import pytest


@pytest.fixture(autouse=True)
def root_logging_restored():
    """Tests that run `cli.main` in-process get its `configure_logging`: a root handler on the
    sys.stderr of that moment, pytest's capture, closed once the test ends. Without this, every
    later log line of the process (the operator tests' API server's, say) hits a closed file;
    `make test` runs files in two processes, so such a test can precede those."""
    root = logging.getLogger()
    before, level = set(root.handlers), root.level
    yield
    for handler in root.handlers[:]:
        # exactly configure_logging's kind: pytest's own handlers subclass StreamHandler
        if type(handler) is logging.StreamHandler and handler not in before:
            root.removeHandler(handler)
    root.setLevel(level)


@pytest.fixture(scope="session")
def smollm2_tokenizer():
    """The bundled SmolLM2's tokenizer and chat template (no tool support in the template), as
    the front end loads it."""
    from radixserve.frontend.tokenizer import load_frontend_tokenizer
    from radixserve.model_loader.tokenizer import bundled_tokenizer, frontend_tokenizer_dir

    return load_frontend_tokenizer(frontend_tokenizer_dir(bundled_tokenizer()))
