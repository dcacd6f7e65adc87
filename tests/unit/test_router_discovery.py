"""EndpointSlices to worker URLs: ready endpoints only, by port name or number, by selector."""

from __future__ import annotations

from typing import Any

import pytest

from radixserve.router.discovery import SliceBook, parse_selector, ready_urls

SELECTOR = {"kubernetes.io/service-name": "llama-workers"}


def endpoint_slice(
    name: str, *endpoints: tuple[str, bool | None], labels: dict | None = None, **extra: Any
) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": SELECTOR if labels is None else labels},
        "addressType": extra.get("address_type", "IPv4"),
        "ports": extra.get("ports", [{"name": "http", "port": 8000, "protocol": "TCP"}]),
        "endpoints": [
            {"addresses": [ip], **({} if ready is None else {"conditions": {"ready": ready}})}
            for ip, ready in endpoints
        ],
    }


def test_only_ready_endpoints_count_and_a_missing_condition_means_ready() -> None:
    piece = endpoint_slice("s1", ("10.0.0.1", True), ("10.0.0.2", False), ("10.0.0.3", None))
    assert ready_urls(piece, "http") == {"http://10.0.0.1:8000", "http://10.0.0.3:8000"}


def test_ports_by_name_or_number_and_ipv6_in_brackets() -> None:
    piece = endpoint_slice(
        "s1", ("fd00::7", True), address_type="IPv6", ports=[{"name": "api", "port": 9000}]
    )
    assert ready_urls(piece, "api") == {"http://[fd00::7]:9000"}
    assert ready_urls(piece, "8080") == {"http://[fd00::7]:8080"}
    assert ready_urls(piece, "http") == set()  # no port of that name: no endpoints


def test_the_book_follows_adds_changes_and_deletes_across_slices() -> None:
    book = SliceBook(SELECTOR, "http")
    book.apply("ADDED", endpoint_slice("s1", ("10.0.0.1", True)))
    book.apply("ADDED", endpoint_slice("s2", ("10.0.0.2", True)))
    assert book.urls() == {"http://10.0.0.1:8000", "http://10.0.0.2:8000"}
    book.apply("MODIFIED", endpoint_slice("s1", ("10.0.0.1", False), ("10.0.0.9", True)))
    assert book.urls() == {"http://10.0.0.9:8000", "http://10.0.0.2:8000"}
    book.apply("DELETED", endpoint_slice("s2"))
    assert book.urls() == {"http://10.0.0.9:8000"}
    book.apply("MODIFIED", endpoint_slice("s1", ("10.0.0.9", True), labels={"other": "x"}))
    assert book.urls() == set()  # the slice no longer matches the selector
    book.replace([endpoint_slice("s3", ("10.0.0.3", True))])
    assert book.urls() == {"http://10.0.0.3:8000"}


def test_selectors_are_equality_terms() -> None:
    assert parse_selector("a=b, c==d") == {"a": "b", "c": "d"}
    for bad in ("a", "a!=b", "=b", "a=b,"):
        with pytest.raises(ValueError):
            parse_selector(bad)
