"""Capture: the ways agent events get into trajstream (SDK, JSON lines, gateway, OTLP ingest)."""
