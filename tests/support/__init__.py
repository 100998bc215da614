"""Helpers shared by the test suites (fixtures live in tests/conftest.py)."""
