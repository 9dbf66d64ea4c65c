"""Exact parameter, byte and KV-cache counts of a config and its checkpoint tensor inventory (torch-free)."""
