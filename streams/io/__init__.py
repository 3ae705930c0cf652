"""Edges to the outside: Kafka clients and their security, the Trinity client."""
