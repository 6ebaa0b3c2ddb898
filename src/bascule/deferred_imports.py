"""Modules a dependency imports at its own import but the server uses rarely or never, loaded on
first use instead.

nats-py's client imports its JetStream API (``nats.js``: 20 ms of every start, about a tenth of the
server's imports) only to read two header names from it, and only for messages carrying a status
(a request that found no responders, a flow control). The server is not a JetStream client: most
starts never touch it. protobuf's descriptor pool imports its pure-Python message classes
(``google.protobuf.internal.python_message``, with the text format: 11 ms, 0.8 MiB) for the pure-Python
implementation only; with upb, as here, only printing a message as text loads them.

pysyncobj imports cryptography at its own import (6.7 MiB resident, 15-25 ms) for the encryptor of
its Raft connections, which bascule makes itself when a connection first needs it: a node alone, the
default, never does. It is imported as if cryptography were not installed (``import_without``).

asyncio and nats-py import ssl (with ``_ssl``, libssl and OpenSSL's initialisation: 4.4 MiB resident)
at their import for TLS only: ``defer_ssl`` leaves it to the first TLS context made, for a server whose
configuration asks for no TLS (a NATS server that asks for it still gets it). nats-py and crc32c look
their own versions up at their import with importlib.metadata (2.7 MiB with email, zipfile, csv...):
a stand-in for it (``stand_in``) gives them ``installed_version``, the same answer read from their
``.dist-info`` directories.

The standard library's ``importlib.util.LazyLoader`` cannot stand in here on Python 3.11: the import
statement reads a module's ``__spec__`` when it finds it in ``sys.modules``, and that read loads a
lazy module. A placeholder module with the real one's spec and path, whose attributes (PEP 562's
module ``__getattr__``) import the real one, is found and bound without loading anything.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import os
import re
import sys
import types
from collections.abc import Callable
from typing import Any

# (package, submodule): the package is imported here, the submodule only when first used.
SERVER_DEFERRED = (("nats", "js"), ("google.protobuf.internal", "python_message"))


def defer_submodules(deferred: tuple[tuple[str, str], ...] = SERVER_DEFERRED) -> None:
    """Imports each package of ``deferred`` with its submodule loaded only when first used. A package
    already imported, or a submodule not found where the package is, is left as it is."""
    for package, child in deferred:
        if package in sys.modules:
            continue
        package_spec = importlib.util.find_spec(package)  # found, not imported
        locations = package_spec.submodule_search_locations if package_spec is not None else None
        name = f"{package}.{child}"
        spec = importlib.machinery.PathFinder.find_spec(name, locations) if locations else None
        if spec is None:
            continue
        sys.modules[name] = _placeholder(spec)
        importlib.import_module(package)
        if name in sys.modules and not hasattr(sys.modules[package], child):
            # A submodule found in sys.modules is not bound to its package by the import statement.
            setattr(sys.modules[package], child, sys.modules[name])


def _placeholder(
    spec: importlib.machinery.ModuleSpec, names: dict[str, Any] | None = None,
    on_load: Callable[[types.ModuleType], None] | None = None,
) -> types.ModuleType:
    """A module standing for ``spec``'s until one of its attributes other than ``names`` is read,
    which imports the real one (in the placeholder's stead in ``sys.modules``, its package and every
    module's namespace that holds the placeholder; ``on_load`` is called with it) and reads it there."""
    placeholder = types.ModuleType(spec.name)
    placeholder.__spec__ = spec
    if spec.submodule_search_locations is not None:
        placeholder.__path__ = list(spec.submodule_search_locations)  # its submodules import as usual
    placeholder.__dict__.update(names or {})
    loaded: list[types.ModuleType] = []

    def load(attribute: str) -> Any:
        if attribute == "__path__":  # not a package (a package's is set): what `from x import y` asks first
            raise AttributeError(attribute)
        if not loaded:
            if sys.modules.get(spec.name) is placeholder:
                del sys.modules[spec.name]
            real = importlib.import_module(spec.name)
            loaded.append(real)
            _rebind(placeholder, real)
            if on_load is not None:
                on_load(real)
        return getattr(loaded[0], attribute)

    placeholder.__getattr__ = load  # type: ignore[method-assign]
    return placeholder


def _rebind(placeholder: types.ModuleType, real: types.ModuleType) -> None:
    """Every module-level name bound to ``placeholder`` bound to ``real`` instead (``import x`` run
    while the placeholder stood in ``sys.modules``): from now on they read it directly."""
    for module in list(sys.modules.values()):
        namespace = getattr(module, "__dict__", None)
        if isinstance(namespace, dict) and module is not placeholder:
            for name in [name for name, value in namespace.items() if value is placeholder]:
                namespace[name] = real


def import_without(package: str, optional: str) -> None:
    """Imports ``package`` as it would be without ``optional`` installed, for a package that imports
    ``optional`` at its own import only to offer it; as usual once either is imported already."""
    if package in sys.modules or optional in sys.modules:
        importlib.import_module(package)
        return
    sys.modules[optional] = None  # type: ignore[assignment]  # the import system's "not installed"
    try:
        importlib.import_module(package)
    finally:
        if optional in sys.modules and sys.modules[optional] is None:
            del sys.modules[optional]


# --- ssl: OpenSSL's TLS, for a node whose configuration asks for none -------------------------------


def defer_ssl() -> bool:
    """Leaves ``ssl`` (with ``_ssl``, libssl and OpenSSL's initialisation: 4.4 MiB resident, 7 ms) to
    its first use; asyncio is imported here for that. Whether it was done (not when asyncio or ssl is
    imported already, nor where either is missing).

    asyncio's modules import ssl at their import and read it only for TLS, but ``asyncio.sslproto``
    reads two of its exception classes at its own import, and every socket operation asks whether its
    socket is an ``ssl.SSLSocket``. So asyncio is imported as it is without ssl (``base_events`` and
    ``selector_events`` bind ``ssl = None``), with ``sslproto`` deferred; every other module finds a
    placeholder for ssl. The first attribute read from it (to make a TLS context: nothing in asyncio
    nor nats-py does TLS without one, a server's asking for TLS included) imports ssl, binds it in
    asyncio's modules in the place of None and in every module's namespace that holds the placeholder,
    as if it had been imported at start; then ``sslproto`` loads when a TLS connection is first made."""
    if "ssl" in sys.modules or "asyncio" in sys.modules:
        return False
    ssl_spec = importlib.util.find_spec("ssl")
    asyncio_spec = importlib.util.find_spec("asyncio")
    locations = asyncio_spec.submodule_search_locations if asyncio_spec is not None else None
    sslproto_spec = importlib.machinery.PathFinder.find_spec("asyncio.sslproto", locations) if locations else None
    if ssl_spec is None or sslproto_spec is None:
        return False
    sys.modules["ssl"] = None  # type: ignore[assignment]  # the import system's "not installed"
    try:
        defer_submodules((("asyncio", "sslproto"),))
    finally:
        del sys.modules["ssl"]
    without = [vars(module) for name, module in sys.modules.items()
               if name.partition(".")[0] == "asyncio" and "ssl" in vars(module) and vars(module)["ssl"] is None]

    def bind(ssl: types.ModuleType) -> None:
        for namespace in without:
            if namespace["ssl"] is None:
                namespace["ssl"] = ssl

    sys.modules["ssl"] = _placeholder(ssl_spec, on_load=bind)
    return True


def load_ssl() -> None:
    """ssl and asyncio's TLS imported now (if ``defer_ssl`` left them to their first use): for a
    configuration that asks for TLS, as if they had not been deferred."""
    for name, attribute in (("ssl", "SSLContext"), ("asyncio.sslproto", "SSLProtocol")):
        getattr(importlib.import_module(name), attribute)  # a placeholder's first read imports the real one


# --- stand-ins: a module of which a package uses one name at its import -----------------------------


def stand_in(name: str, **names: Any) -> types.ModuleType | None:
    """Puts in ``sys.modules``, for the module ``name`` not imported yet, a placeholder that has
    ``names`` (as the real module would give them) and imports the real module for any other
    attribute: for packages that take only these names of it at their import. Returned, for
    ``withdraw``; None when ``name`` is imported already or not found."""
    if name in sys.modules:
        return None
    spec = importlib.util.find_spec(name)
    if spec is None:
        return None
    placeholder = _placeholder(spec, names)
    sys.modules[name] = placeholder
    return placeholder


def stand_in_for_versions() -> types.ModuleType | None:
    """``stand_in`` for importlib.metadata with ``installed_version`` as its ``version``: for the
    server's imports, where nats-py and crc32c read their own versions and nothing else of it."""
    return stand_in("importlib.metadata", version=installed_version)


def withdraw(placeholder: types.ModuleType | None) -> None:
    """``stand_in``'s placeholder out of ``sys.modules`` (if still there): the module imports as usual
    from now on. Modules that took names from it keep them."""
    if placeholder is not None and sys.modules.get(placeholder.__name__) is placeholder:
        del sys.modules[placeholder.__name__]


def installed_version(distribution: str) -> str:
    """``importlib.metadata.version(distribution)`` without importing importlib.metadata (with email,
    zipfile, csv...: 2.7 MiB resident, 15 ms) where it would find the version as it usually does: in
    the first directory on ``sys.path`` holding a ``.dist-info`` directory of that name, its METADATA's
    Version header. Anything else (an ``.egg-info``, an egg or zip on the path, another finder of
    distributions, a METADATA it would parse otherwise) is importlib.metadata's to answer."""
    wanted = _normalized(distribution)
    if any(getattr(finder, "find_distributions", None) is not None
           and finder is not importlib.machinery.PathFinder for finder in sys.meta_path):
        return _version_by_importlib_metadata(distribution)
    for entry in sys.path:
        root = entry or "."
        if not os.path.isdir(root) or os.path.basename(root).lower().endswith(".egg"):
            if os.path.exists(root):
                return _version_by_importlib_metadata(distribution)
            continue
        try:
            children = os.listdir(root)
        except OSError:
            continue
        for child in children:
            low = child.lower()
            if not low.endswith((".dist-info", ".egg-info")):
                continue
            if _normalized(low.rpartition(".")[0].partition("-")[0]) == wanted:
                version = _metadata_version(os.path.join(root, child)) if low.endswith(".dist-info") else None
                return version if version is not None else _version_by_importlib_metadata(distribution)
    return _version_by_importlib_metadata(distribution)


def _normalized(name: str) -> str:
    """importlib.metadata's normalisation of a distribution name (PEP 503, dashes as underscores)."""
    return re.sub(r"[-_.]+", "-", name).lower().replace("-", "_")


def _metadata_version(info: str) -> str | None:
    """The Version header of ``info``'s METADATA, when it is a plain one (None otherwise)."""
    try:
        with open(os.path.join(info, "METADATA"), encoding="utf-8") as metadata:
            lines = []
            for line in metadata:
                if not line.strip():
                    break
                lines.append(line)
    except (OSError, UnicodeDecodeError):
        return None
    for index, line in enumerate(lines):
        name, colon, value = line.partition(":")
        if colon and name.lower() == "version":
            continued = index + 1 < len(lines) and lines[index + 1][:1] in (" ", "\t")
            return None if continued else value.lstrip(" \t").rstrip("\r\n")
    return None


def _version_by_importlib_metadata(distribution: str) -> str:
    from importlib.metadata import version

    return version(distribution)
