"""`radixserve router`: one endpoint in front of many workers, routing by prefix and load.

Its own process, without the engine: it imports neither torch nor the worker's managers,
model executor or layers, only the torch-free error shape (`radixserve.api_errors`).
`policies` (the registry) and `prefix_tree` decide where a request goes, `pool` knows the
workers and their health, `discovery` finds them (a fixed list or EndpointSlices), `proxy`
forwards, retries what no worker started and relays, `quarantine` remembers requests that
coincided with workers' deaths (and refuses one at its second), and `server` runs the aiohttp
app and checks API keys.
"""
