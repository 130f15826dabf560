"""Helpers of the exporter's tests (tests/test_prometheus*.py)."""
