"""`radixserve router` flags: defaults, the checks, and the CLI's errors for bad input."""

from __future__ import annotations

import pytest

from radixserve.entrypoints import cli
from radixserve.router.args import parse_router_args


def test_defaults_follow_sglang_and_urls_lose_their_trailing_slash() -> None:
    args = parse_router_args(["--worker-url", "http://a:8000/", "--worker-url", "http://b:8000"])
    assert args.worker_urls == ("http://a:8000", "http://b:8000")
    assert args.policy == "cache_aware"
    config = args.policy_config()
    assert (config.cache_threshold, config.balance_abs_threshold) == (0.5, 32.0)
    assert config.balance_rel_threshold == pytest.approx(1.0001)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "give the workers"),
        (["--worker-url", "http://a:1", "--discover-selector", "a=b"], "give the workers"),
        (["--worker-url", "a:8000"], "is not a base URL"),
        (["--worker-url", "http://a:1/v1"], "is not a base URL"),
        (["--discover-selector", "app"], "is not key=value"),
        (["--worker-url", "http://a:1", "--cache-threshold", "1.5"], "--cache-threshold"),
        (["--worker-url", "http://a:1", "--balance-rel-threshold", "0.5"], "--balance-rel"),
        (["--worker-url", "http://a:1", "--max-retries", "-1"], "--max-retries"),
        (["--worker-url", "http://a:1", "--health-check-interval", "0"], "--health-check"),
    ],
)
def test_bad_flags_are_refused_with_a_message_naming_them(argv, message, capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["router", *argv])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_an_unknown_policy_is_refused_with_the_known_ones(capsys) -> None:
    with pytest.raises(SystemExit):
        cli.main(["router", "--worker-url", "http://a:1", "--policy", "random"])
    err = capsys.readouterr().err
    assert "invalid choice: 'random'" in err and "cache_aware" in err


def test_unreachable_discovery_is_an_error_at_start(tmp_path, monkeypatch, capsys) -> None:
    config = tmp_path / "kubeconfig"
    config.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: k, cluster: {server: 'http://127.0.0.1:9'}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: c, context: {cluster: k, user: u}}]\n"
    )
    monkeypatch.setenv("KUBECONFIG", str(config))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    code = cli.main(["router", "--discover-selector", "app=x", "--namespace", "ns"])
    err = capsys.readouterr().err
    assert code == 1
    assert "cannot list EndpointSlices in namespace 'ns'" in err and "127.0.0.1:9" in err


def test_missing_cluster_credentials_are_an_error_at_start(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "absent"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    assert cli.main(["router", "--discover-selector", "app=x"]) == 1
    assert "no Kubernetes credentials" in capsys.readouterr().err


def test_the_router_imports_neither_torch_nor_the_engine() -> None:
    import subprocess
    import sys

    probe = (
        "import sys, radixserve.router.server, radixserve.router.args;"
        "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('radixserve.')))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout
    modules = eval(loaded)  # a printed list of module names
    assert "torch" not in modules
    assert {m.split(".")[1] for m in modules} == {
        "api_errors",
        "api_keys",
        "logging_config",
        "kv_event_format",
        "router",
    }
