"""Shared fixtures: a broker process per test module, fresh topics per test."""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.brokerproc import BrokerProcess


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """One broker for the module: 127.0.0.1, a free port, a fresh data dir."""
    data = tmp_path_factory.mktemp("broker")
    with BrokerProcess(data, {"num.partitions": "1"}) as b:
        yield b


@pytest.fixture
def topic_name(request: pytest.FixtureRequest) -> str:
    base = request.node.name.replace("[", "-").replace("]", "").replace("/", "-")[:80]
    base = "".join(c if c.isalnum() or c in "._-" else "-" for c in base)
    return f"{base}-{uuid.uuid4().hex[:6]}"


def has_kcat() -> bool:
    return shutil.which("kcat") is not None


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    d = tmp_path / "data"
    d.mkdir()
    return d
