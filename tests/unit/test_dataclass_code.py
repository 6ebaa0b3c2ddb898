"""Dataclasses' generated code kept between processes (bascule.dataclass_code): a class made from kept
code is the class compiled afresh; a file that does not load is ignored; nothing is written where
bytecode would not be; the server's imports find every text in a file `make bytecode` wrote."""

import dataclasses
import marshal
import subprocess
import sys
import textwrap

import pytest

from bascule import dataclass_code


@pytest.fixture
def cache(tmp_path):
    yield tmp_path / "__pycache__" / "dataclass-code.marshal"
    dataclass_code.finish(write=False)


def make_class():
    @dataclasses.dataclass(frozen=True, order=True)
    class Point:
        x: int
        y: int = 2
        tags: tuple[str, ...] = dataclasses.field(default=(), compare=False)

        def __post_init__(self):
            if self.x < 0:
                raise ValueError("x")

    return Point


def behaviour(point_class):
    p, q = point_class(1), point_class(1, 3, ("t",))
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.x = 5
    with pytest.raises(ValueError):
        point_class(-1)
    return (repr(p), repr(q), p == point_class(1), p < q, hash(p) == hash(point_class(1, 2, ("other",))),
            dataclasses.astuple(q), [f.name for f in dataclasses.fields(point_class)])


def test_a_class_made_from_kept_code_is_the_class_compiled_afresh(cache):
    afresh = behaviour(make_class())
    dataclass_code.install(cache)
    first = behaviour(make_class())
    dataclass_code.finish(cache, write=True)
    assert cache.exists() and "exec" not in vars(dataclasses)  # compiling as usual again
    written = cache.stat().st_mtime_ns

    dataclass_code.install(cache)
    kept = behaviour(make_class())
    dataclass_code.finish(cache, write=True)
    assert afresh == first == kept
    assert cache.stat().st_mtime_ns == written  # every text was found: nothing to write


MAGIC = dataclass_code.importlib.util.MAGIC_NUMBER


@pytest.mark.parametrize("garbage", [
    b"", b"\x00\xff garbage", marshal.dumps([1, 2, 3]), marshal.dumps((b"\x00\x00\x0d\x0a", {})),
    marshal.dumps((MAGIC, {b"digest": "not code", "text": compile("", "", "exec")})),
    marshal.dumps((MAGIC, ["not", "a", "dict"])),
])
def test_a_file_that_does_not_load_is_ignored_and_written_anew(cache, garbage):
    cache.parent.mkdir(parents=True)
    cache.write_bytes(garbage)
    assert dataclass_code.load(cache) == {}
    afresh = behaviour(make_class())
    dataclass_code.install(cache)
    assert behaviour(make_class()) == afresh
    dataclass_code.finish(cache, write=True)
    assert len(dataclass_code.load(cache)) >= 3  # __init__, __repr__, __eq__ at least


def test_nothing_is_written_where_bytecode_would_not_be(cache, monkeypatch, tmp_path):
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    dataclass_code.install(cache)
    make_class()
    dataclass_code.finish(cache)
    assert not cache.exists()

    unwritable = tmp_path / "a-file" / "__pycache__" / "cache"  # its directory cannot be made
    unwritable.parent.parent.write_text("")
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    dataclass_code.install(unwritable)
    make_class()
    dataclass_code.finish(unwritable)  # as in a read-only install: no error, no file
    assert not unwritable.parent.parent.is_dir()


def test_the_server_s_imports_find_every_text_in_the_file_written_for_them(tmp_path):
    cache = tmp_path / "cache"
    run = textwrap.dedent(f"""
        import pathlib
        from bascule import dataclass_code
        from bascule.deferred_imports import defer_submodules
        dataclass_code.install(pathlib.Path({str(cache)!r}))
        defer_submodules()
        import bascule.server
        dataclass_code.finish(pathlib.Path({str(cache)!r}), write=True)
    """)
    subprocess.run([sys.executable, "-c", run], check=True)
    written = cache.stat().st_mtime_ns
    assert len(dataclass_code.load(cache)) > 300
    subprocess.run([sys.executable, "-c", run], check=True)
    assert cache.stat().st_mtime_ns == written
