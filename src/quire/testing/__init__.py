"""Test seams shared by Quire's test suites (no test framework imports here)."""
