"""The I/O edges: every Kafka client is built in ``kafka``, the Trinity client and its one
retry policy live in ``trinity``, the schema registry's client in ``registry``.

May import the top-level modules, aiokafka and httpx; not the core's runners or the devtools.
"""
