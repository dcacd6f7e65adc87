import pytest
from engine_harness import greedy as make_greedy


@pytest.fixture
def greedy():
    return make_greedy


API_KEY = "sk-radixserve-test"
ADMIN_API_KEY = "sk-radixserve-admin"


@pytest.fixture(scope="session")
def api_server(tmp_path_factory):
    """The bundled SmolLM2 behind API keys, shared by the modules that drive the OpenAI
    surface (one server start for all of them). Its template has no tool support, so tools go
    through the built-in tool template and the Hermes parser; Qwen3-style <think> blocks are
    split off (SmolLM2 writes none unless a grammar makes it)."""
    from radixserve.bench.server_process import ServerProcess

    log = tmp_path_factory.mktemp("api_server") / "server.log"
    args = ["--max-total-tokens", "8192", "--api-key", API_KEY, "--admin-api-key", ADMIN_API_KEY]
    args += ["--reasoning-parser", "qwen3"]
    with ServerProcess(args, log_path=log) as proc:
        yield proc
    assert proc.process.returncode == 0, log.read_text()[-3000:]


@pytest.fixture(scope="session")
def api_keys() -> tuple[str, str]:
    """(API key, admin API key) of api_server."""
    return API_KEY, ADMIN_API_KEY


@pytest.fixture(scope="session")
def api_client(api_server):
    import openai

    with openai.OpenAI(
        base_url=api_server.base_url + "/v1", api_key=API_KEY, max_retries=0
    ) as client:
        yield client
