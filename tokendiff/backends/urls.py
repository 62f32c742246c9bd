"""Server URLs as the user gives them: checked once (http(s), a host, a valid port), shown with any password
hidden, and the loopback policy (replay and a listening proxy stay on this machine unless told otherwise)."""

from __future__ import annotations

import ipaddress
import re
from urllib.parse import urlsplit

from tokendiff.errors import InputError


def is_loopback_host(host: str) -> bool:
    """True for localhost and loopback addresses (IPv6 with or without brackets)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def shown_url(url: str) -> str:
    """A URL as errors may print it: any password in it replaced by ***."""
    return re.sub(r"(//[^/@:]*):[^/@]*@", r"\1:***@", url)


def check_url(url: str, option: str) -> str:
    """A server URL the user gave (`--server`, `--backend`, `--upstream`): http(s), a host, a valid port.
    Anything else is an InputError naming the option and the URL (its password hidden)."""
    import httpx

    why = ""
    try:
        u = httpx.URL(url)
        if u.scheme not in ("http", "https") or not u.host:
            why = "not an http(s) URL with a host (e.g. http://127.0.0.1:8080)"
        elif u.port is not None and not 0 < u.port < 65536:
            why = f"not a valid URL (port {u.port} out of range)"
    except (httpx.InvalidURL, ValueError, TypeError) as e:
        why = f"not a valid URL ({e})"
    if why:
        raise InputError(why, source=f"{option} {shown_url(url)!r}")
    return url


def is_loopback_url(url: str) -> bool:
    """Replay sends a server prompts and load: only one on this machine unless the user says otherwise."""
    return is_loopback_host(urlsplit(url).hostname or "")
