"""Real tokenizers of other model families, for the explainers and the grammar (missing ones skip, or fail
in CI)."""

from __future__ import annotations

import pytest
from prompts import RealTokenizer, real_tokenizer


@pytest.fixture(scope="session")
def llama3_tok() -> RealTokenizer:
    return real_tokenizer("llama3")


@pytest.fixture(scope="session")
def harmony_tok() -> RealTokenizer:
    return real_tokenizer("harmony")


@pytest.fixture(scope="session")
def gemma_tok() -> RealTokenizer:
    return real_tokenizer("gemma")


@pytest.fixture(scope="session")
def deepseek_tok() -> RealTokenizer:
    return real_tokenizer("deepseek")


@pytest.fixture(scope="session")
def mistral_tok() -> RealTokenizer:
    return real_tokenizer("mistral")
