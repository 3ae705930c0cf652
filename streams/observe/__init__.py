"""Seeing what a deployment does: Prometheus metrics, health endpoints, ``trajstream status``
and the status page.

- :mod:`streams.observe.metrics`  every metric of a worker, behind a small recording API
- :mod:`streams.observe.web`      the worker's HTTP server: ``/metrics``, ``/healthz``, ``/readyz``
- :mod:`streams.observe.status`   one snapshot of a deployment, read from its topics and group
- :mod:`streams.observe.pages`    the status page: server-rendered HTML with an inline SVG plot

Nothing here imports faust: the live runner calls the recording API, and the status command
reads Kafka with aiokafka directly. Modules here may import the package's top-level modules
(models, codec, settings, topics, errors) and each other.
"""
