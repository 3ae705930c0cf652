"""Capture: the edges where agent traffic enters trajstream (SDK, JSON lines, the gateway and
its openai wrapper, OTLP ingest).

Modules here may import the package's models, codec, settings, topics, errors, the pure
selection code and streams.io; nothing in the pipeline's core imports them.
"""
