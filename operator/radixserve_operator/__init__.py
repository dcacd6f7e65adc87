"""The radixserve operator: reconciles ``InferenceService`` objects into worker workloads.

The package is cut into pure parts (``spec`` parses and validates, ``manifests`` builds child
objects, ``status`` computes conditions) and thin effectful parts (``kube`` talks to the API
server, ``handlers`` wires kopf, ``main`` runs the process), so that almost everything can be
tested without a cluster.
"""

GROUP = "radixserve.io"
VERSION = "v1alpha1"
PLURAL = "inferenceservices"
KIND = "InferenceService"
API_VERSION = f"{GROUP}/{VERSION}"
FIELD_MANAGER = "radixserve-operator"
