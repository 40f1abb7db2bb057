"""The sidecar process: an asyncio loop that drives the ordering core with the Kafka
shells and the peer transport, and serves health, metrics and status over HTTP."""
