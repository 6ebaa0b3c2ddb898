"""A deferred submodule: bound to its package and found by every form of import, executed only when
one of its attributes is first read."""

import importlib
import sys
import textwrap

import pytest

from bascule.deferred_imports import defer_submodules


@pytest.fixture
def package(tmp_path, monkeypatch, request):
    """A package that imports its submodule ``heavy`` at its own import, as nats-py does ``nats.js``."""
    name = f"deferred_{request.node.name.replace('[', '_').replace(']', '_')}"
    root = tmp_path / name
    (root / "heavy").mkdir(parents=True)
    (root / "__init__.py").write_text(textwrap.dedent(f"""
        import {name}.heavy

        def value():
            return {name}.heavy.VALUE
    """))
    (root / "heavy" / "__init__.py").write_text("import builtins\nbuiltins.heavy_runs += 1\nVALUE = 42\n")
    (root / "heavy" / "part.py").write_text("PART = 'part'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr("builtins.heavy_runs", 0, raising=False)
    yield name
    for module in [m for m in sys.modules if m == name or m.startswith(f"{name}.")]:
        del sys.modules[module]


def test_the_submodule_runs_only_when_first_read(package):
    import builtins

    defer_submodules(((package, "heavy"),))
    assert builtins.heavy_runs == 0
    assert sys.modules[package].value() == 42
    assert sys.modules[package].value() == 42
    assert builtins.heavy_runs == 1
    assert sys.modules[f"{package}.heavy"] is sys.modules[package].heavy


def test_from_imports_and_submodules_of_it_still_work(package):
    import builtins

    defer_submodules(((package, "heavy"),))
    assert importlib.import_module(f"{package}.heavy.part").PART == "part"
    assert builtins.heavy_runs == 0  # a submodule of the deferred one imports on its own
    namespace: dict = {}
    exec(f"from {package}.heavy import VALUE", namespace)
    assert namespace["VALUE"] == 42
    assert builtins.heavy_runs == 1


def test_an_imported_package_is_left_alone(package):
    import builtins

    importlib.import_module(package)
    defer_submodules(((package, "heavy"),))
    assert builtins.heavy_runs == 1
    assert type(sys.modules[f"{package}.heavy"].__spec__.loader).__name__ == "SourceFileLoader"


def test_a_missing_package_or_submodule_is_skipped(package):
    defer_submodules(((package, "absent"), ("no_such_package_here", "js")))
    assert package not in sys.modules and "no_such_package_here" not in sys.modules


@pytest.fixture
def offering(tmp_path, monkeypatch, request):
    """A package that imports an optional one at its own import only to offer it, as pysyncobj does
    cryptography, and the optional one."""
    name = f"offering_{request.node.name}"
    optional = f"optional_{request.node.name}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(f"""
        try:
            import {optional}
            HAS_OPTIONAL = True
        except ImportError:
            HAS_OPTIONAL = False
    """))
    (tmp_path / f"{optional}.py").write_text("VALUE = 7\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name, optional
    for module in (name, optional):
        sys.modules.pop(module, None)


def test_a_package_imported_without_its_optional_one_leaves_it_importable(offering):
    from bascule.deferred_imports import import_without

    package, optional = offering
    import_without(package, optional)
    assert sys.modules[package].HAS_OPTIONAL is False
    assert optional not in sys.modules
    assert importlib.import_module(optional).VALUE == 7  # whoever needs it later imports it as usual


def test_import_without_changes_nothing_once_either_is_imported(offering):
    from bascule.deferred_imports import import_without

    package, optional = offering
    importlib.import_module(optional)
    import_without(package, optional)
    assert sys.modules[package].HAS_OPTIONAL is True


def test_a_loaded_submodule_replaces_its_placeholder_wherever_it_was_bound(package, tmp_path):
    (tmp_path / f"{package}_user.py").write_text(f"import {package}.heavy as heavy\n")
    defer_submodules(((package, "heavy"),))
    user = importlib.import_module(f"{package}_user")
    placeholder = user.heavy
    assert sys.modules[package].value() == 42
    assert user.heavy is sys.modules[f"{package}.heavy"] is not placeholder  # read directly from now on
    del sys.modules[f"{package}_user"]


@pytest.fixture
def module(tmp_path, monkeypatch, request):
    """A top-level module that counts its runs, as hmac or importlib.metadata would be."""
    name = f"standing_{request.node.name}"
    (tmp_path / f"{name}.py").write_text("import builtins\nbuiltins.heavy_runs += 1\nVALUE = 42\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr("builtins.heavy_runs", 0, raising=False)
    yield name
    sys.modules.pop(name, None)


def test_a_stand_in_gives_its_names_without_the_module_and_the_module_for_the_rest(module):
    import builtins

    from bascule.deferred_imports import stand_in, withdraw

    placeholder = stand_in(module, VALUE=41)
    namespace: dict = {}
    exec(f"from {module} import VALUE", namespace)
    assert namespace["VALUE"] == 41 and builtins.heavy_runs == 0
    withdraw(placeholder)
    assert module not in sys.modules
    assert importlib.import_module(module).VALUE == 42 and builtins.heavy_runs == 1
    assert stand_in(module, VALUE=41) is None  # imported already: left as it is


def test_a_stand_in_imports_the_module_for_a_name_it_does_not_have(module):
    import builtins

    from bascule.deferred_imports import stand_in

    placeholder = stand_in(module, OTHER=1)
    assert placeholder is not None and placeholder.VALUE == 42 and builtins.heavy_runs == 1
    assert type(sys.modules[module].__spec__.loader).__name__ == "SourceFileLoader"


@pytest.mark.parametrize("distribution", ["nats-py", "nats_py", "NATS.py", "crc32c", "protobuf", "msgpack",
                                          "PySyncObj", "hpack", "bascule"])
def test_installed_version_is_importlib_metadata_s(distribution):
    from importlib.metadata import version

    from bascule.deferred_imports import installed_version

    assert installed_version(distribution) == version(distribution)


def test_installed_version_of_a_distribution_not_installed_is_importlib_metadata_s_error():
    from importlib.metadata import PackageNotFoundError

    from bascule.deferred_imports import installed_version

    with pytest.raises(PackageNotFoundError):
        installed_version("no-such-distribution-here")


def test_installed_version_reads_the_first_dist_info_on_the_path_and_leaves_odd_ones_to_importlib(
        tmp_path, monkeypatch):
    from importlib.metadata import version

    from bascule.deferred_imports import installed_version

    first, second = tmp_path / "first", tmp_path / "second"
    for root, text in ((first, "Metadata-Version: 2.1\nName: Odd.Thing\nVersion: 1.0rc1 \n\nVersion: 9\n"),
                       (second, "Metadata-Version: 2.1\nName: odd-thing\nVersion: 2.0\n")):
        (root / "odd_thing-1.dist-info").mkdir(parents=True)
        (root / "odd_thing-1.dist-info" / "METADATA").write_text(text)
    monkeypatch.syspath_prepend(str(second))
    monkeypatch.syspath_prepend(str(first))
    assert installed_version("odd-thing") == version("odd-thing") == "1.0rc1 "
    # A folded header: importlib.metadata's to parse.
    (first / "odd_thing-1.dist-info" / "METADATA").write_text("Name: odd-thing\nVersion: 1.0\n  .1\n\n")
    assert installed_version("odd-thing") == version("odd-thing")


SSL_PROBE = """
import sys
from bascule.deferred_imports import defer_ssl
assert defer_ssl()
loaded = [name for name in ("_ssl", "ssl") if "__file__" in vars(sys.modules.get(name) or sys)]
import asyncio, asyncio.base_events, asyncio.selector_events, ssl
print("before", loaded, asyncio.base_events.ssl, asyncio.selector_events.ssl, "asyncio.sslproto" in sys.modules)

server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
server_context.load_cert_chain(sys.argv[1], sys.argv[2])
client_context = ssl.create_default_context(cafile=sys.argv[3])

async def echo(reader, writer):
    writer.write(await reader.readline())
    await writer.drain()
    writer.close()

async def main():
    server = await asyncio.start_server(echo, "127.0.0.1", 0, ssl=server_context)
    port = server.sockets[0].getsockname()[1]
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client_context)
    writer.write(b"over TLS\\n")
    first = await reader.readline()
    writer.close()
    plain = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    reader, writer = await asyncio.open_connection("127.0.0.1", server.sockets[0].getsockname()[1])
    await writer.start_tls(client_context, server_hostname="localhost")  # as nats-py upgrades
    writer.write(b"upgraded\\n")
    second = await reader.readline()
    writer.close()
    server.close()
    plain.close()
    return first, second

print("after", *asyncio.run(main()), asyncio.base_events.ssl is sys.modules["ssl"] is ssl,
      asyncio.selector_events.ssl is ssl, "SSLAgainErrors" in vars(sys.modules["asyncio.sslproto"]))
"""


def test_deferred_ssl_is_not_loaded_until_a_tls_context_is_made_then_asyncio_does_tls(tmp_path):
    import subprocess

    from conftest import issue

    ca = issue(tmp_path, "ca", None)
    _, _, cert, key = issue(tmp_path, "localhost", ca[:2])
    run = subprocess.run([sys.executable, "-c", SSL_PROBE, str(cert), str(key), str(ca[2])],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    before, after = run.stdout.splitlines()
    assert before == "before [] None None True"
    assert after == "after b'over TLS\\n' b'upgraded\\n' True True True"
