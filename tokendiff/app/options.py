"""What the faces check before any work: the server URLs a user gave."""

from __future__ import annotations

from tokendiff.backends.urls import check_url as check


def check_url(url: str, option: str) -> str:
    """A server URL option (`--server`, `--backend`, `--upstream`, `--live`), checked: a bad one is an
    InputError naming the option and the URL, its password hidden."""
    return check(url, option)
