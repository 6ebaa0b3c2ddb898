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

The standard library's ``importlib.util.LazyLoader`` cannot stand in here on Python 3.11: the import
statement reads a module's ``__spec__`` when it finds it in ``sys.modules``, and that read loads a
lazy module. A placeholder module with the real one's spec and path, whose attributes (PEP 562's
module ``__getattr__``) import the real one, is found and bound without loading anything.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import sys
import types
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


def _placeholder(spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
    """A module standing for ``spec``'s until one of its attributes is read, which imports the real
    one (bound to its package and ``sys.modules`` in the placeholder's stead) and reads it there."""
    placeholder = types.ModuleType(spec.name)
    placeholder.__spec__ = spec
    placeholder.__path__ = list(spec.submodule_search_locations or [])  # its submodules import as usual

    def load(attribute: str) -> Any:
        if sys.modules.get(spec.name) is placeholder:
            del sys.modules[spec.name]
        return getattr(importlib.import_module(spec.name), attribute)

    placeholder.__getattr__ = load  # type: ignore[method-assign]
    return placeholder


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
