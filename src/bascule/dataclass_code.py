"""The code of dataclasses' generated methods, compiled once and kept as bytecode is.

The dataclasses module writes each class's methods (``__init__``, ``__eq__``, ``__repr__``, ...) as
source text and compiles it with ``exec`` as the class is made: 500 compiles, 50-70 ms of the
server's 230 ms of imports, on every start. Python keeps a module's bytecode in ``__pycache__``, not
these; here their code objects are kept likewise, in a marshal file in bascule's ``__pycache__``,
found by a digest of the very text they were compiled from (a text compiles to the same code
wherever it comes from), and an ``exec`` of a text found runs its code instead of compiling it. A
text not found is compiled as before.

The file is written where Python would write bytecode: by ``make bytecode`` (``python -m
bascule.dataclass_code``), and by a server whose start compiled texts the file lacked unless bytecode
writing is off (``PYTHONDONTWRITEBYTECODE``). It is trusted as the ``.pyc`` files beside it are; one
that does not load (another Python, damage) is ignored.
"""

from __future__ import annotations

import builtins
import contextlib
import dataclasses
import hashlib
import importlib.util
import marshal
import os
import sys
import tempfile
import types
from pathlib import Path
from typing import Any

CACHE = Path(__file__).parent / "__pycache__" / f"dataclass-code.{sys.implementation.cache_tag}.marshal"


def text_digest(text: str) -> bytes:
    # The texts themselves would hold as much memory as their code (170 KiB for the server's).
    return hashlib.blake2b(text.encode(), digest_size=16).digest()


class _CodeCache:
    """The code objects by their texts' digests, as loaded, and whether this process compiled texts
    it lacked."""

    def __init__(self, codes: dict[bytes, types.CodeType]) -> None:
        self.codes = codes
        self.missed = False

    def exec(self, source: Any, globals_: Any = None, locals_: Any = None) -> None:
        if isinstance(source, str):
            digest = text_digest(source)
            code = self.codes.get(digest)
            if code is None:
                code = self.codes[digest] = compile(source, "<string>", "exec")
                self.missed = True
            source = code
        builtins.exec(source, globals_, locals_)


_cache: _CodeCache | None = None


def install(path: Path = CACHE) -> None:
    """From now on until `finish`, dataclasses made in this process take their code from ``path``'s
    file where it has it."""
    global _cache
    if _cache is None:
        _cache = _CodeCache(load(path))
        # The dataclasses module finds exec among its globals before the builtins.
        dataclasses.exec = _cache.exec  # type: ignore[attr-defined]


def finish(path: Path = CACHE, *, write: bool | None = None) -> None:
    """Dataclasses compile as usual again; the file takes what this process compiled if it lacked
    any and ``write`` (by default: unless bytecode writing is off)."""
    global _cache
    if _cache is None:
        return
    cache, _cache = _cache, None
    with contextlib.suppress(AttributeError):
        del dataclasses.exec  # type: ignore[attr-defined]
    if cache.missed and (not sys.dont_write_bytecode if write is None else write):
        with contextlib.suppress(OSError):  # a read-only install keeps compiling, as without bytecode
            save(path, cache.codes)


def load(path: Path) -> dict[bytes, types.CodeType]:
    """The file's digests and codes; nothing from a file this Python did not write, or damaged."""
    try:
        magic, codes = marshal.loads(path.read_bytes())
    except (OSError, EOFError, ValueError, TypeError):
        return {}
    if magic != importlib.util.MAGIC_NUMBER or not isinstance(codes, dict):
        return {}
    return {
        digest: code for digest, code in codes.items() if isinstance(digest, bytes) and isinstance(code, types.CodeType)
    }


def save(path: Path, codes: dict[bytes, types.CodeType]) -> None:
    # Whole or not at all, whoever else writes it at the same time: the last one in wins.
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(marshal.dumps((importlib.util.MAGIC_NUMBER, codes)))
        os.chmod(temporary, 0o644)  # readable by whoever runs the server, as bytecode is
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def main() -> None:
    """Writes the file for what `bascule server` imports (``make bytecode``)."""
    from bascule.cli import import_server

    import_server(write_code=True)


if __name__ == "__main__":
    main()
