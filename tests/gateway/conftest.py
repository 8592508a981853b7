"""The fixtures every gateway test module shares: a fake engine over a real socket, and an
HTTP client."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.gateway.test_gateway import FakeEngine


@pytest.fixture
def engine() -> Iterator[FakeEngine]:
    e = FakeEngine().start()
    yield e
    e.stop()


@pytest.fixture
def http() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=10) as client:
        yield client
