"""The install script (run by the Dockerfile and by CI) resolves the CPU and the CUDA
installs, refuses an unknown device, and the Dockerfile uses it."""

import pathlib
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "install.sh"


def run_script(**env: str) -> subprocess.CompletedProcess:
    import os
    return subprocess.run(["sh", str(SCRIPT)], env={**os.environ, **env}, capture_output=True,
                          text=True, timeout=600)


def test_unknown_device_is_a_clear_error():
    out = run_script(GENVI_DEVICE="tpu")
    assert out.returncode == 2 and "GENVI_DEVICE=tpu is not a device; use cpu or cuda" in out.stderr


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_install_resolves_with_pinned_versions(device):
    # a dry run resolves every pinned requirement (for cuda: jax[cuda12] at the pinned
    # JAX, its plugin and CUDA wheels) against the package index without installing
    out = run_script(GENVI_DEVICE=device, GENVI_PIP_ARGS="--dry-run")
    assert out.returncode == 0, out.stderr[-2000:]
    assert f"resolved genvi for {device}" in out.stdout
    if device == "cuda":
        assert "jax-cuda12-plugin-0.10.2" in out.stdout or "jax_cuda12_plugin-0.10.2" in out.stdout


def test_dockerfile_installs_with_the_script_and_runs_the_demo():
    text = (ROOT / "Dockerfile").read_text()
    assert "ARG DEVICE=cpu" in text and 'GENVI_DEVICE="$DEVICE" sh scripts/install.sh' in text
    assert 'CMD ["genvi", "run", "demo"]' in text
    assert "scripts/install.sh" in (ROOT / ".ci" / "run").read_text()
