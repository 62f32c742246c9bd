"""Helpers for tests, the demo and benchmarks: a tiny real model, a real llama-server."""
