"""The folders every weights test reads: written once per test session (each ~0.5 s) and never changed; a test that
damages a folder works on its own copy."""
from __future__ import annotations

import pytest

from tests.weights.folders import shipped_official, tiny_v4_official


@pytest.fixture(scope="session")
def official(tmp_path_factory):
    return shipped_official(tmp_path_factory.mktemp("weights") / "official")


@pytest.fixture(scope="session")
def official_v4(tmp_path_factory):
    return tiny_v4_official(tmp_path_factory.mktemp("weights") / "tiny-v4")
