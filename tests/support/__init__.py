"""Test helpers shared by all suites (importable as ``support`` via tests/conftest.py)."""
