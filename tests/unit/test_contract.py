"""`radixserve.contract` lists the names the worker answers to; each registry that implements
them holds exactly those names, so the CLI, the CRD's enums and the code cannot drift."""

from __future__ import annotations

from radixserve import contract
from radixserve.catalog.attention_backends import BACKENDS
from radixserve.frontend.openai.reasoning_parsers import REASONING_PARSERS
from radixserve.frontend.openai.tool_parsers import TOOL_PARSERS
from radixserve.router.policies import POLICIES as ROUTER_POLICIES
from radixserve.scheduler.schedule_policy import SCHEDULE_POLICIES


def test_each_registry_implements_exactly_the_published_names():
    assert set(SCHEDULE_POLICIES) == set(contract.SCHEDULE_POLICIES)
    assert set(TOOL_PARSERS) == set(contract.TOOL_PARSERS)
    assert set(REASONING_PARSERS) == set(contract.REASONING_PARSERS)
    assert set(ROUTER_POLICIES) == set(contract.ROUTER_POLICIES)
    assert contract.registered_choices()["attention_backend"] == ("auto", *BACKENDS)


def test_a_registered_choice_outside_the_contract_is_refused():
    args = contract.parse_server_args(["--schedule-policy", "fcfs"])
    assert args.schedule_policy == "fcfs"
    args.tool_call_parser = "made-up"
    try:
        contract.check_server_args(args)
    except ValueError as exc:
        assert "--tool-call-parser" in str(exc)
    else:
        raise AssertionError("an unknown tool parser passed the contract's check")
