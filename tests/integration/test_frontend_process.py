"""The front end is its own light process: a running `radixserve serve` maps no libtorch in
the process that serves HTTP, while its scheduler child does (the check can fail)."""

from __future__ import annotations

from pathlib import Path


def mapped_libraries(pid: int) -> set[str]:
    names = set()
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        parts = line.split(maxsplit=5)
        if len(parts) == 6 and ".so" in parts[5]:
            names.add(Path(parts[5]).name)
    return names


def test_the_http_process_maps_no_torch_and_its_scheduler_does(api_server, api_client):
    # a request first: tokenizing and detokenizing must not pull torch in either
    api_client.completions.create(
        model=api_client.models.list().data[0].id, prompt="Hi", max_tokens=2
    )
    front = api_server.process.pid
    front_libraries = mapped_libraries(front)
    assert front_libraries, "no shared libraries read from /proc: the check would prove nothing"
    assert not [name for name in front_libraries if name.startswith("libtorch")]
    scheduler_maps = [mapped_libraries(child) for child in api_server.child_pids()]
    assert any(name.startswith("libtorch") for libraries in scheduler_maps for name in libraries), (
        "the scheduler child should map libtorch"
    )
