"""Documents and their renderers: the diff, the session report, the fleet; markdown, HTML,
JSON and the dataset. They format what the core computed, and compute nothing themselves.

May import: tokendiff.core and the shared leaves; no HTTP, no UI.
"""
