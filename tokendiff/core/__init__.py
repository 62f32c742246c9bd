"""The core: pure computation over prompts (the model, the vocabulary table, alignment, the template grammar,
sections, the explainers and their causes, what each engine can reuse, the session's costs).

May import: tokendiff.errors, tokendiff.notices, numpy, orjson; nothing that reads files, speaks HTTP or
draws (checked by import-linter: pyproject.toml).
"""
