"""Errors the torch-free layer raises for bad input; each message names the key or file and the problem."""


class ConfigError(ValueError):
    """A config.json that cannot describe a model; the message names the key and the problem."""
