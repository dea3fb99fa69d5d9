"""NumPyro's internals are read in one place, `genvi/interop/numpyro_internals.py`, as
JAX's are in `genvi/core/` (tests/test_jax_internals_fence.py).

Every module of `genvi/` is read with `ast`: a private NumPyro name (an import of one,
or the module `numpyro.contrib.control_flow.scan` that holds them), and the layout of a
NumPyro message beyond its public fields (`msg["args"]`, `msg["kwargs"]`), are allowed
only in that module; NumPyro's classes are known by class, never by name. On the
running NumPyro (CI runs this module at both ends of the range, constraints/) the
private names are there and the scan message reads and answers as genvi expects; a
release that renames one fails loudly, naming itself.
"""

from __future__ import annotations

import ast
import importlib.util
import pathlib
import re

import pytest

numpyro = pytest.importorskip("numpyro")

from genvi.interop import numpyro_internals  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]
LIBRARY = ROOT / "genvi"
INTERNALS = LIBRARY / "interop" / "numpyro_internals.py"
PRIVATE_MODULES = ("numpyro.contrib.control_flow.scan",)


def _private_readers(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, what) for each private NumPyro name, private module or message layout
    read in `tree`."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("numpyro"):
            for alias in node.names:
                if alias.name.startswith("_") or f"{node.module}.{alias.name}" in PRIVATE_MODULES:
                    found.append((node.lineno, f"{node.module}.{alias.name}"))
            if any(part.startswith("_") for part in node.module.split(".")) \
                    or node.module in PRIVATE_MODULES:
                found.append((node.lineno, node.module))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names
                      if a.name.startswith("numpyro") and (a.name in PRIVATE_MODULES or any(
                          part.startswith("_") for part in a.name.split(".")))]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and node.value in PRIVATE_MODULES:
            found.append((node.lineno, node.value))   # importlib.import_module("...")
        elif isinstance(node, ast.Attribute) and node.attr.startswith("_PYRO"):
            found.append((node.lineno, node.attr))
        elif (isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name)
              and node.value.id == "msg" and isinstance(node.slice, ast.Constant)
              and node.slice.value in ("args", "kwargs")):
            found.append((node.lineno, f'msg["{node.slice.value}"]'))
    return found


def _names_compared(tree: ast.AST) -> list[int]:
    """Lines that key a class by its name: `type(x).__name__` compared, tested for
    membership or looked up."""
    def is_name_of(node: ast.AST) -> bool:
        return isinstance(node, ast.Attribute) and node.attr == "__name__"

    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and any(
                is_name_of(n) for n in [node.left, *node.comparators]):
            lines.append(node.lineno)
        elif isinstance(node, ast.Subscript) and is_name_of(node.slice):
            lines.append(node.lineno)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr == "get" and node.args and is_name_of(node.args[0])):
            lines.append(node.lineno)
    return lines


def test_numpyro_private_names_are_read_only_in_one_module():
    found = {}
    for path in sorted(LIBRARY.rglob("*.py")):
        if path == INTERNALS:
            continue
        hits = _private_readers(ast.parse(path.read_text()))
        if hits:
            found[str(path.relative_to(ROOT))] = hits
    assert not found, ("NumPyro's private names or message layout read outside "
                       f"genvi/interop/numpyro_internals.py: {found}")


def test_the_fence_finds_each_form():
    src = ("from numpyro.primitives import _PYRO_STACK\n"
           "from numpyro.contrib.control_flow.scan import scan_wrapper\n"
           "import numpyro.contrib.control_flow.scan\n"
           "m = importlib.import_module('numpyro.contrib.control_flow.scan')\n"
           "s = numpyro.primitives._PYRO_STACK\n"
           "a = msg['args']\n"
           "from numpyro.primitives import Messenger\n")
    assert sorted(line for line, _ in _private_readers(ast.parse(src))) == [1, 2, 3, 4, 5, 6]
    assert _private_readers(ast.parse(INTERNALS.read_text()))   # it does read them


def test_other_libraries_classes_are_known_by_class_not_name():
    interop = sorted((LIBRARY / "interop").glob("*.py"))
    found = {str(p.relative_to(ROOT)): lines for p in interop
             if (lines := _names_compared(ast.parse(p.read_text())))}
    assert not found, f"classes keyed by their name: {found}"
    src = ("a = type(d).__name__ == 'Unit'\nb = type(d).__name__ in S\nc = T.get(type(d).__name__)\n"
           "d = T[type(d).__name__]\ne = f'{type(d).__name__}'\n")
    assert _names_compared(ast.parse(src)) == [1, 2, 3, 4]


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(".")[:3])


def test_the_running_numpyro_is_within_the_tested_ends_which_ci_installs():
    oldest, newest = numpyro_internals.TESTED
    assert _version(oldest) <= _version(numpyro.__version__) <= _version(newest)
    pins = {}
    for end in ("oldest", "newest"):
        text = (ROOT / "constraints" / f"{end}.txt").read_text()
        pins[end] = re.search(r"^numpyro==(\S+)$", text, re.M).group(1)
    assert (pins["oldest"], pins["newest"]) == (oldest, newest)
    ranges = set(re.findall(r'"numpyro>=([\d.]+),<([\d.]+)"',
                            (ROOT / "pyproject.toml").read_text()))
    assert len(ranges) == 1, f"every extra names one NumPyro range: {ranges}"
    (low, high), = ranges
    assert low == oldest and _version(newest) < _version(high + ".0")


def test_the_scan_message_reads_and_answers_as_genvi_expects():
    numpyro_internals.check_scan_layout()


def test_a_renamed_private_name_fails_loudly_naming_the_release(monkeypatch):
    monkeypatch.delattr(numpyro.primitives, "_PYRO_STACK")
    spec = importlib.util.spec_from_file_location("renamed_numpyro_internals", INTERNALS)
    # the copy's own NumPyroInternalsChanged, an ImportError
    with pytest.raises(ImportError, match=rf"NumPyro {re.escape(numpyro.__version__)} has no "
                                          r"numpyro\.primitives\._PYRO_STACK.*tested with NumPyro"):
        spec.loader.exec_module(importlib.util.module_from_spec(spec))


def test_a_moved_scan_layout_fails_loudly(monkeypatch):
    def old_layout(msg, length, carry, ys):   # the carry where the length was
        msg["value"] = ((carry, None, length), (numpyro_internals._PYTREE_TRACE({}), ys))
    monkeypatch.setattr(numpyro_internals, "answer_scan", old_layout)
    with pytest.raises(numpyro_internals.NumPyroInternalsChanged, match="layout"):
        numpyro_internals.check_scan_layout()
