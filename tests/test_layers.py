"""The library's import graph follows the pipeline, one way (SPEC §8).

Every import statement in `genvi/` is read with `ast`, those inside functions too, and
resolved to the genvi module it loads. The graph must have no circle, between modules
and between packages; no module may import a higher layer of the pipeline
(core <- replays <- distributions <- gen <- adev <- the rest); nothing imports the experiments;
and every module must import alone, first, in a fresh interpreter.
"""

from __future__ import annotations

import ast
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
LIBRARY = ROOT / "genvi"
LAYERS = ["genvi.core", "genvi.replays", "genvi.distributions", "genvi.gen",
          "genvi.adev"]  # lowest first


def _modules() -> dict[str, pathlib.Path]:
    out = {}
    for path in sorted(LIBRARY.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _imports(name: str, path: pathlib.Path) -> list[tuple[str, int]]:
    """(imported module, line) for every import statement of the module, nested ones
    included; `from pkg import name` counts `pkg.name` where that is a module."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            targets = [base] + [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        for target in targets:
            # `import genvi.x.y` loads genvi.x and genvi.x.y (and the root package,
            # which every submodule import runs: only a direct import of it counts)
            parts = target.split(".")
            for i in range(1 if target == "genvi" else 2, len(parts) + 1):
                prefix = ".".join(parts[:i])
                # a module's own packages below the root are loaded before it whatever
                # it imports (a package's submodules reading each other is no edge to
                # the package); a direct import of the root is one (see below)
                ancestor = prefix != "genvi" and name.startswith(prefix + ".")
                if prefix in MODULES and prefix != name and not ancestor:
                    found.append((prefix, node.lineno))
    return found


EDGES = {name: _imports(name, path) for name, path in MODULES.items()}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One circle of `graph` (a list of nodes, first repeated last), or None."""
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def _package(module: str) -> str:
    """The room a module belongs to: genvi.core, ..., or a top-level module."""
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 else module


def test_the_graph_is_read():
    assert len(MODULES) > 40
    assert ("genvi.core.jaxpr", ) == tuple(m for m, _ in EDGES["genvi.core.tracing"]
                                           if m == "genvi.core.jaxpr")


def test_no_circle_between_modules():
    # the root package imports everything (it is the public surface); leave it out
    graph = {m: {t for t, _ in ts if t != "genvi"} for m, ts in EDGES.items() if m != "genvi"}
    assert _cycle(graph) is None, " -> ".join(_cycle(graph))


def test_no_circle_between_packages():
    graph: dict[str, set[str]] = {}
    for module, targets in EDGES.items():
        if module == "genvi":
            continue
        for target, _ in targets:
            if target != "genvi" and _package(target) != _package(module):
                graph.setdefault(_package(module), set()).add(_package(target))
    assert _cycle(graph) is None, " -> ".join(_cycle(graph))


def test_the_cycle_finder_finds_one():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def _layer(module: str) -> int:
    for i, layer in enumerate(LAYERS):
        if module == layer or module.startswith(layer + "."):
            return i
    return len(LAYERS)  # objectives, inference, guides, training, cli, the root


def test_imports_run_down_the_pipeline():
    upward = [f"{m} imports {t} (line {line})" for m, ts in EDGES.items() for t, line in ts
              if _layer(t) > _layer(m)]
    assert not upward, "\n".join(upward)


def test_the_library_imports_no_experiment():
    for path in MODULES.values():
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            assert not any(n.split(".")[0] in ("experiments", "genvi_experiments")
                           for n in names), f"{path} imports {names}"


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_every_module_imports_alone_first():
    """Each module imported first, in a child forked from an interpreter that has
    loaded JAX but nothing of genvi. The root package's `__init__` (which imports the
    whole public surface, in its own order) is stood in for by an empty package, so
    each module must import what it needs itself; only modules that import the root
    directly (`import genvi as gv`: the demo) load the real one."""
    script = textwrap.dedent("""
        import importlib, os, sys, traceback, types
        import jax, jax.numpy, numpy   # the slow third-party imports, shared by the children
        library, names = sys.argv[1], sys.argv[2:]
        failed = []
        for entry in names:
            name, _, real_root = entry.partition(":")
            pid = os.fork()
            if pid == 0:
                try:
                    if not real_root:
                        root = types.ModuleType("genvi")
                        root.__path__ = [library]
                        sys.modules["genvi"] = root
                    importlib.import_module(name)
                except BaseException:
                    traceback.print_exc()
                    os._exit(1)
                os._exit(0)
            _, status = os.waitpid(pid, 0)
            if status != 0:
                failed.append(name)
        print("FAILED:" + ",".join(failed))
        """)
    names = [m + (":root" if m == "genvi" or any(t == "genvi" for t, _ in EDGES[m]) else "")
             for m in sorted(MODULES)]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu"}
    out = subprocess.run([sys.executable, "-c", script, str(LIBRARY), *names], cwd=ROOT,
                         env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    failed = out.stdout.strip().rpartition("FAILED:")[2]
    assert failed == "", f"modules that fail to import alone: {failed}\n{out.stderr[-3000:]}"


def test_every_module_is_a_small_room():
    """No module of the library is over about 400 lines (420 with its docstrings'
    examples): a module that grows past it holds two concerns, and splits."""
    sizes = {name: path.read_text().count("\n") for name, path in _modules().items()}
    big = {name: n for name, n in sizes.items() if n > 420}
    assert not big, big
