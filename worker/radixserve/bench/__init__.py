"""`radixserve bench`: the benchmark drivers (latency, offline, serving, router) and the server
process harness they and the tests start."""
