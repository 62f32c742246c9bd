"""Every TUI test runs in the checkout: the apps are given paths relative to it, so snapshots do not depend
on where the checkout is."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _in_repo_root(in_repo_root):
    return in_repo_root
