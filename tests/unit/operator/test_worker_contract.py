"""Contracts shared by the operator and the worker, checked against each other.

The operator turns an InferenceService into a `radixserve serve` command line; the worker's
own parser (flags, choices, ServerArgs' checks) must accept every command line the operator
can generate from a spec the API server accepts. A spec that would crash-loop its pods must be
refused by the CRD (or by the operator, which reports it as Degraded) instead.
"""

from __future__ import annotations

import pytest
from crd_strategies import accepted, specs
from hypothesis import HealthCheck, given, settings
from operator_crd_checks import EXAMPLES, SCHEMA

from radixserve.contract import parse_server_args, registered_choices
from radixserve.router.args import parse_router_args
from radixserve.server_args import static_choices
from radixserve_operator.manifests import Owner, worker_args
from radixserve_operator.manifests.router import router_args
from radixserve_operator.spec import InvalidSpecError, parse_spec

ENGINE = SCHEMA["properties"]["spec"]["properties"]["engine"]["properties"]


def worker_accepts(spec: dict) -> None:
    """The worker's real parser and checks on the arguments the operator generates for
    `spec` (extraArgs are the user's own flags and are left out)."""
    try:
        service = parse_spec(spec, name="svc", default_image="radixserve:test")
    except InvalidSpecError:
        return  # refused by the operator (Degraded), so no pod ever runs these arguments
    args = worker_args(service)
    extra = list(service.engine.extra_args)
    args = args[: len(args) - len(extra)] if extra else args
    assert args[0] == "serve"
    try:
        parse_server_args(args[1:])
    except SystemExit as exc:  # argparse refused a flag or a value
        raise AssertionError(f"the worker refuses {args!r}") from exc
    if service.router.enabled:
        command = router_args(Owner("svc", "ns", "uid"), service)
        try:
            parse_router_args(command[1:])
        except SystemExit as exc:
            raise AssertionError(f"the router refuses {command!r}") from exc


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda doc: doc["metadata"]["name"])
def test_every_example_yields_arguments_the_worker_accepts(example):
    worker_accepts(example["spec"])


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(specs.filter(accepted))
def test_any_accepted_spec_yields_arguments_the_worker_accepts(spec):
    worker_accepts(spec)


@pytest.mark.parametrize(
    ("crd_field", "server_arg"),
    [
        ("attentionBackend", "attention_backend"),
        ("dtype", "dtype"),
        ("schedulePolicy", "schedule_policy"),
    ],
)
def test_crd_enums_are_the_workers_choices(crd_field, server_arg):
    choices = {**static_choices(), **registered_choices()}[server_arg]
    assert ENGINE[crd_field]["enum"] == list(choices)


def test_a_served_name_that_starts_with_a_dash_reaches_worker_and_router_as_a_value():
    spec = {
        "model": {"name": "-dash", "uri": "builtin:smollm2-135m"},
        "router": {"enabled": True},
    }
    service = parse_spec(spec, name="svc", default_image="radixserve:test")
    assert service.router.enabled
    worker_accepts(spec)
    args = parse_router_args(router_args(Owner("svc", "ns", "uid"), service)[1:])
    assert args.model_name == "-dash"


def test_model_task_is_the_workers_task_and_reaches_it_only_when_set():
    model = SCHEMA["properties"]["spec"]["properties"]["model"]["properties"]
    assert model["task"]["enum"] == list(static_choices()["task"])
    for task in ("generate", "embed", "rerank"):
        spec = {"model": {"uri": "hf://Qwen/Qwen3-Embedding-0.6B", "task": task}}
        worker_accepts(spec)
        args = worker_args(parse_spec(spec, name="svc", default_image="radixserve:test"))
        assert f"--task={task}" in args
    detected = parse_spec({"model": {"uri": "builtin:smollm2-135m"}}, name="s", default_image="i")
    assert not any(arg.startswith("--task") for arg in worker_args(detected))
    with pytest.raises(InvalidSpecError, match="task"):
        parse_spec(
            {"model": {"uri": "builtin:smollm2-135m", "task": "x"}}, name="s", default_image="i"
        )
