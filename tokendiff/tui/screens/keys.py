"""Bindings every screen shares."""

from __future__ import annotations

from textual.binding import Binding

HELP = Binding(
    "question_mark", "app.help", "help", key_display="?", tooltip="every key, and the colours", id="app.help"
)
