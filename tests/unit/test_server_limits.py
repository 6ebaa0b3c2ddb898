"""What the composition root makes of the process's limit of open files (bascule.server)."""

from __future__ import annotations

import resource

import pytest

from bascule import server
from bascule.h2grpc import GrpcLimits


@pytest.fixture
def open_files(monkeypatch):
    """The process's (soft, hard) limit of open files, as the code under test sees and sets it."""
    limit = [1024, 4096]
    monkeypatch.setattr(resource, "getrlimit", lambda which: tuple(limit))
    monkeypatch.setattr(resource, "setrlimit", lambda which, value: limit.__setitem__(slice(None), value))
    return limit


def test_the_soft_limit_of_open_files_is_raised_to_the_hard_one(open_files):
    server.raise_open_files_limit()
    assert open_files == [4096, 4096]


def test_an_unlimited_hard_limit_raises_the_soft_one_to_a_million(open_files):
    open_files[1] = resource.RLIM_INFINITY
    server.raise_open_files_limit()
    assert open_files[0] == 1 << 20


def test_grpc_connections_are_held_to_half_the_open_files(open_files, caplog):
    assert server.grpc_limits_for_open_files(GrpcLimits(max_connections=100)) == GrpcLimits(max_connections=100)
    assert server.grpc_limits_for_open_files(GrpcLimits(max_connections=4096)).max_connections == 512
    assert "at most 512 gRPC connections" in caplog.text
