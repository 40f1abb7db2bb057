"""Independent checks of replicated topics, used by the demo and the integration tests.

Deliberately written against plain confluent-kafka only: it parses kdsync's headers
itself and imports nothing of the sidecar (record format, ordering), so a bug there
cannot hide itself here.
"""
