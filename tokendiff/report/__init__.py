"""Renderers: they format what the core computed, and compute nothing themselves."""
