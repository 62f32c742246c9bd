"""tokendiff: token-level prompt diff and prefix-cache forensics."""

__version__ = "0.1.0"
