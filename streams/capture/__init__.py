"""Capture: ways agents publish their events (SDK, JSON lines, gateway, OTLP ingest)."""
