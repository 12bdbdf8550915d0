"""Helpers shared by the test modules (local HTTP proxy in front of stack services)."""
