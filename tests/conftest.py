"""Test configuration: the real-service fixtures live in tests/stack_fixtures.py."""

pytest_plugins = ["tests.stack_fixtures"]
