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
