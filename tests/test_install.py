"""The install script (run by the Dockerfile and by CI) resolves the CPU and the CUDA
installs, refuses an unknown device, and the Dockerfile uses it."""

import pathlib
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "install.sh"


def run_script(**env: str) -> subprocess.CompletedProcess:
    import os
    import sys
    # the script's `python` is the one running these tests (its environment's JAX)
    path = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
    return subprocess.run(["sh", str(SCRIPT)], env={**os.environ, "PATH": path, **env},
                          capture_output=True, text=True, timeout=600)


def test_unknown_device_is_a_clear_error():
    out = run_script(GENVI_DEVICE="tpu")
    assert out.returncode == 2 and "GENVI_DEVICE=tpu is not a device; use cpu or cuda" in out.stderr


def constraints_of_this_jax() -> pathlib.Path:
    """The constraints file whose JAX is the one this suite runs on."""
    import jax
    for path in sorted((ROOT / "constraints").glob("*.txt")):
        if f"jax=={jax.__version__}\n" in path.read_text():
            return path
    pytest.skip(f"no constraints file pins the running JAX {jax.__version__}")


@pytest.mark.parametrize("device, installer", [("cpu", "pip"), ("cuda", "uv")],
                         ids=["cpu-pip", "cuda-uv"])
def test_install_resolves_with_ci_versions(device, installer):
    # a dry run resolves every requirement at CI's exact versions (for cuda: jax[cuda12]
    # at the constrained JAX, its plugin and CUDA wheels) without installing. Both
    # installers resolve the same requirements; cuda's through uv, which reads the
    # CUDA wheels' metadata without fetching them (pip's dry run fetches a few GB)
    import jax
    out = run_script(GENVI_DEVICE=device, GENVI_PIP_ARGS="--dry-run", GENVI_INSTALLER=installer,
                     GENVI_EXPERIMENTS="1",
                     GENVI_CONSTRAINTS=str(constraints_of_this_jax()))
    assert out.returncode == 0, out.stderr[-2000:]
    assert f"resolved genvi for {device}" in out.stdout
    if device == "cuda":
        v = jax.__version__
        assert any(f"{name}{sep}{v}" in out.stdout + out.stderr
                   for name in ("jax-cuda12-plugin", "jax_cuda12_plugin") for sep in ("-", "==")), \
            out.stdout[-2000:]


def test_dependencies_are_ranges_and_constraints_pin_both_ends():
    import tomllib
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert not [d for d in project["dependencies"] if "==" in d], project["dependencies"]
    oldest = (ROOT / "constraints" / "oldest.txt").read_text()
    newest = (ROOT / "constraints" / "newest.txt").read_text()
    jax_range = next(d for d in project["dependencies"] if d.startswith("jax>="))
    assert "jax==" + jax_range.split(">=")[1].split(",")[0] + "\n" in oldest
    assert "jax==0.12." in newest


def test_dockerfile_installs_with_the_script_and_runs_the_demo():
    text = (ROOT / "Dockerfile").read_text()
    assert "ARG DEVICE=cpu" in text and 'GENVI_DEVICE="$DEVICE" GENVI_EXPERIMENTS=1 sh scripts/install.sh' in text
    assert 'CMD ["genvi", "run", "demo"]' in text
    assert "scripts/install.sh" in (ROOT / ".ci" / "run").read_text()


# the experiments `genvi run` knows besides the built-in demo
EXPERIMENTS = {"noisy_cone", "vae", "ssvae", "cvae", "eight_schools", "logreg", "gmm", "air"}


def build_wheel(folder: pathlib.Path, project: pathlib.Path, names: tuple) -> pathlib.Path:
    """A wheel of the project at `project` (no dependencies), built from a copy of its
    files `names`, so that the checkout gets no build/ or *.egg-info from it. Offline
    where this environment can build wheels itself (setuptools >= 70.1, or the wheel
    package); otherwise in pip's isolated build environment, from the configured
    package index."""
    import importlib.metadata
    import importlib.util
    import shutil
    import sys

    source = folder / "source"
    source.mkdir()
    for name in names:
        if (project / name).is_dir():
            shutil.copytree(project / name, source / name,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info"))
        else:
            shutil.copy(project / name, source / name)
    setuptools = tuple(int(p) for p in importlib.metadata.version("setuptools").split(".")[:2])
    offline = setuptools >= (70, 1) or (setuptools >= (68, 0) and importlib.util.find_spec("wheel"))
    isolation = ["--no-build-isolation", "--no-index"] if offline else []
    out = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", *isolation,
                          "--wheel-dir", str(folder / "dist"), str(source)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    (wheel,) = (folder / "dist").glob("*.whl")
    return wheel


def _unpacked(wheel: pathlib.Path, folder: pathlib.Path) -> tuple[list, pathlib.Path]:
    """The wheel's file names, and its unpacked .dist-info folder."""
    import zipfile
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        zf.extractall(folder)
    (info,) = folder.glob("*.dist-info")
    return names, info


def test_genvis_wheel_holds_genvi_alone_typed(tmp_path):
    import importlib.metadata

    wheel = build_wheel(tmp_path, ROOT, ("pyproject.toml", "README.md", "genvi"))
    names, info = _unpacked(wheel, tmp_path / "unpacked")
    # the library alone: its experiments are a project beside it (experiments/)
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith((".dist-info", ".data"))}
    assert tops == {"genvi"}, tops
    assert set((info / "top_level.txt").read_text().split()) == {"genvi"}
    assert "genvi/py.typed" in names   # PEP 561: type checkers read genvi's hints
    dist = importlib.metadata.PathDistribution(info)
    assert {ep.value for ep in dist.entry_points.select(group="console_scripts")} == {"genvi.cli:main"}
    assert not list(dist.entry_points.select(group="genvi.experiments"))


def test_the_experiments_wheel_registers_every_experiment(tmp_path):
    import importlib.metadata

    wheel = build_wheel(tmp_path, ROOT / "experiments", ("pyproject.toml", "genvi_experiments"))
    names, info = _unpacked(wheel, tmp_path / "unpacked")
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith((".dist-info", ".data"))}
    assert tops == {"genvi_experiments"}, tops
    dist = importlib.metadata.PathDistribution(info)
    registered = {ep.name: ep for ep in dist.entry_points.select(group="genvi.experiments")}
    assert set(registered) == EXPERIMENTS, sorted(registered)

    # every entry point names a record of genvi_experiments/registry.py whose module is in
    # the wheel, and the registry holds no record that is not registered
    from genvi_experiments import registry
    records = {name: value for name, value in vars(registry).items()
               if isinstance(value, registry.Experiment)}
    assert {ep.value for ep in registered.values()} == \
        {f"genvi_experiments.registry:{attr}" for attr in records}
    for ep in registered.values():
        module = records[ep.attr].module.replace(".", "/")
        assert f"{module}.py" in names or f"{module}/__init__.py" in names, module


def test_a_checkout_finds_its_experiments_without_installing_them(monkeypatch):
    import importlib.metadata

    from genvi import cli
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda group: [])
    found = cli.experiments()
    assert EXPERIMENTS | {"demo"} == set(found)
    assert found["noisy_cone"].module == "genvi_experiments.noisy_cone"


def test_ci_type_checks_genvi_which_ships_its_hints():
    import tomllib
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]
    assert config["mypy"]["packages"] == ["genvi"]
    assert "ignore_errors" not in str(config["mypy"])   # no module is let off
    assert config["setuptools"]["package-data"]["genvi"] == ["py.typed"]
    assert (ROOT / "genvi" / "py.typed").is_file()
    assert "\n  mypy" in (ROOT / ".ci" / "run").read_text()
