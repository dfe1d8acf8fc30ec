"""Fault-injection scenarios (`pytest -m faults`)."""
