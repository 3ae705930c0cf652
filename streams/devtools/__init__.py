"""The workshop, shipped with the package so that ``trajstream demo`` works from a fresh clone:
the local Kafka broker, the Trinity stand-in, the demo and simulated traffic.

May import anything in the package; nothing in the product (core, runtime, io, capture,
export) imports this subpackage.
"""
