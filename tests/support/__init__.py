"""Helpers shared by the test modules: clients and proxies for the local stack."""
