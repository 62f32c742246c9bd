"""In-process tests of the code: no CLI run, no terminal, no server. `pytest tests/unit` is the quick check."""
