"""Experiments run end to end at a tiny size."""

import itertools
import json
import math
import os
import pathlib
import re
import time
import types

import jax.numpy as jnp
import numpy as np
import pytest

import genvi as gv
from genvi_experiments import noisy_cone


def test_noisy_cone_tiny(tmp_path):
    out = noisy_cone.main(["--steps", "20", "--estimates-per-step", "4", "--eval", "200",
                           "--out", str(tmp_path)])
    assert abs(out["log_evidence"] - (-5.32)) < 0.01
    for name in noisy_cone.PAPER:
        assert math.isfinite(out[name]) and out[name] < out["log_evidence"]
    assert len([f for f in os.listdir(tmp_path) if f.endswith(".png")]) == 5
    assert "DIWHVI" in (tmp_path / "results.md").read_text()


def test_cli_lists_and_runs_an_experiment(tmp_path, capsys):
    from genvi.cli import main
    assert main(["list"]) == 0
    listing = capsys.readouterr().out
    assert "noisy_cone" in listing and "--quick" in listing
    # every experiment shows its expected time at the defaults
    assert all(re.search(rf"^{name}\s+[0-9.]+ (s|min)\s", listing, re.M)
               for name in ("demo", "noisy_cone", "vae", "ssvae", "cvae", "air")), listing
    out = tmp_path / "demo"
    assert main(["run", "demo", "--steps", "200", "--out", str(out)]) == 0
    assert (out / "results.md").exists() and (out / "objective.png").exists()
    assert "posterior mean of mu" in capsys.readouterr().out



def test_every_registered_experiment_has_a_module_with_main():
    import importlib.util

    from genvi.cli import experiments
    found = experiments()
    assert list(found)[:2] == ["demo", "noisy_cone"] and "air" in found
    for name, record in found.items():
        spec = importlib.util.find_spec(record.module)  # the module stays unimported
        assert spec is not None, (name, record.module)
        assert "def main(" in pathlib.Path(spec.origin).read_text(), (name, record.module)


def test_unknown_experiment_is_a_clear_error(capsys):
    from genvi.cli import main
    with pytest.raises(SystemExit) as exit_:
        main(["run", "nosuch"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'nosuch'" in err and "'noisy_cone'" in err and "'demo'" in err


def test_another_package_registers_an_experiment(tmp_path, monkeypatch, capsys):
    """A package adds `my_model = "my_registry:MY_MODEL"` to the genvi.experiments
    entry points: `genvi list` shows it without importing it, `genvi run` runs it, and
    an entry point that does not load is skipped with a warning."""
    import importlib.metadata
    import sys

    (tmp_path / "my_registry.py").write_text(
        "import types\n"
        "MY_MODEL = types.SimpleNamespace(module='my_model', about='my model, fitted', time='3 s')\n")
    (tmp_path / "my_model.py").write_text("def main(argv):\n    print('my_model got', argv)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    installed = importlib.metadata.entry_points
    extra = [importlib.metadata.EntryPoint("my_model", "my_registry:MY_MODEL", "genvi.experiments"),
             importlib.metadata.EntryPoint("broken", "no_such_module:X", "genvi.experiments")]
    monkeypatch.setattr(importlib.metadata, "entry_points",
                        lambda group: [*installed(group=group), *extra])
    from genvi.cli import main
    assert main(["list"]) == 0
    out, err = capsys.readouterr()
    assert re.search(r"^my_model\s+3 s  my model, fitted$", out, re.M) and "noisy_cone" in out
    assert "skipping experiment 'broken'" in err and "my_model" not in sys.modules
    assert main(["run", "my_model", "--steps", "2"]) == 0
    assert "my_model got ['--steps', '2', '--out', 'out/my_model']" in capsys.readouterr().out


def test_vae_tiny(tmp_path):
    from genvi_experiments import vae
    out = vae.main(["--epochs", "2", "--train-size", "200", "--test-size", "50",
                    "--eval-particles", "20", "--hidden", "32", "--out", str(tmp_path)])
    assert [r["epoch"] for r in out["log"]] == [1, 2]
    final = out["final"]
    # IWELBO(K) ≥ ELBO in expectation; both are finite, negative log-likelihood bounds
    assert -64 * math.log(2) - 10 < final["test ELBO"] < final["test log-lik (IWELBO-1000)"] + 0.5 < 0
    assert sorted(os.listdir(tmp_path)) == ["curves.png", "reconstructions.png", "results.md",
                                            "samples.png"]


def test_vae_iwelbo_training_tiny(tmp_path):
    from genvi_experiments import vae
    out = vae.main(["--epochs", "1", "--objective", "iwelbo", "--particles", "3", "--train-size",
                    "100", "--test-size", "20", "--eval-particles", "10", "--hidden", "16",
                    "--out", str(tmp_path)])
    assert math.isfinite(out["final"]["test ELBO"])
    assert "IWELBO(3)" in (tmp_path / "results.md").read_text()


def test_ssvae_tiny(tmp_path):
    from genvi_experiments import ssvae
    out = ssvae.main(["--epochs", "2", "--eval-every", "1", "--train-size", "300", "--test-size",
                      "60", "--hidden", "32", "--out", str(tmp_path)])
    assert 0.0 <= out["final"]["test accuracy"] <= 1.0
    assert math.isfinite(out["final"]["test ELBO"])
    assert (tmp_path / "samples_by_class.png").exists() and (tmp_path / "accuracy.png").exists()


def test_cvae_tiny(tmp_path):
    from genvi_experiments import cvae
    out = cvae.main(["--epochs", "2", "--train-size", "200", "--test-size", "40", "--hidden", "32",
                     "--eval-particles", "10", "--out", str(tmp_path)])
    losses = out["losses"]
    assert all(math.isfinite(v) and v > 0 for v in losses.values())
    # −IWELBO(K) ≤ −ELBO in expectation (a tighter bound)
    assert losses["CVAE −IWELBO(10)"] < losses["CVAE −ELBO"] + 0.5
    assert (tmp_path / "completions.png").exists()


def test_vae_step_harness_tiny():
    from genvi_experiments.bench.vae import step as vae_step
    rows = vae_step.main(["--batches", "8", "--systems", "hand", "numpyro", "--pixels", "16",
                          "--hidden", "8", "--latent", "2", "--rounds", "2"])
    assert [r["system"] for r in rows] == ["hand", "numpyro"]
    assert all(r["ratio"] > 0 for r in rows)


def test_vae_quality_tiny():
    from genvi_experiments.bench.vae import quality as vae_quality
    out = vae_quality.main(["--epochs", "2", "--train-size", "200", "--hidden", "16",
                            "--eval-particles", "10"])
    # the same objective, networks, initialization and data: close after two epochs too
    assert abs(out["gap"]) < 3.0


def test_vae_roofline_counts_the_steps_products():
    """The floor times exactly the matrix products genvi's compiled step contains."""
    import re

    import jax
    import jax.numpy as jnp
    import optax

    from genvi_experiments.bench import systems
    from genvi_experiments.bench.vae import roofline as vae_roofline
    from genvi_experiments.common.nets import VAENets
    nets = VAENets(16, 8, 2)
    key = jax.random.key(0)
    state, step = systems.genvi_vae(nets, nets.init(key), optax.adam(1e-3))
    hlo = step.lower(state, key, jnp.zeros((8, 16))).compile().as_text()
    assert len(re.findall(r" dot\(", hlo)) == len(vae_roofline.product_shapes(nets, 8)) == 11
    rows = vae_roofline.main(["--batches", "8", "--pixels", "16", "--hidden", "8", "--latent", "2",
                              "--rounds", "2", "--peak-size", "64", "--no-pyro"])
    (row,) = rows
    # 2·B·(forward + weight gradients) over 4 layers + input gradients of the last 3
    assert row["flops"] == 2 * 8 * (2 * (16 * 8 + 8 * 4 + 2 * 8 + 8 * 16) + (8 * 4 + 2 * 8 + 8 * 16))
    assert row["xla_flops"] >= row["flops"]     # XLA also counts the elementwise work
    assert row["floor"] > 0 and row["genvi"] > 0 and row["peak_gflops"]["xla"] > 0


def test_experiment_sizes_must_be_positive(capsys):
    from genvi_experiments import vae
    with pytest.raises(SystemExit):
        vae.main(["--epochs", "0"])
    assert "--epochs: must be at least 1, got 0" in capsys.readouterr().err


def test_run_help_shows_the_experiments_options_with_defaults(capsys):
    from genvi.cli import main
    with pytest.raises(SystemExit) as exit_:
        main(["run", "vae", "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert "genvi run vae" in out and "--epochs" in out and "(default: 100)" in out
    assert main(["run", "--help"]) == 0
    assert "experiments: demo" in capsys.readouterr().out


def test_eight_schools_tiny(tmp_path):
    from genvi_experiments import eight_schools
    results = eight_schools.main(["--steps", "50", "--particles", "2", "--optimum-draws", "200",
                                  "--optimum-iterations", "3", "--out", str(tmp_path)])
    assert len(results) == 12 and all(np.isfinite(r["max_mean_diff"]) for r in results.values())
    assert (tmp_path / "results.md").exists() and (tmp_path / "theta.png").exists()


def test_gmm_tiny(tmp_path):
    from genvi_experiments import gmm
    out = gmm.main(["--points", "300", "--batch-size", "64", "--steps", "300", "--out", str(tmp_path)])
    assert np.isfinite(out["error"]) and (tmp_path / "gmm.png").exists()


def test_logreg_tiny(tmp_path):
    from genvi_experiments import logreg
    out = logreg.main(["--points", "2000", "--batch-size", "256", "--steps", "400", "--out", str(tmp_path)])
    # a smoke run (the default run reports coverage and accuracy); the weights are learned
    assert out["covered"] > 0.5 and out["accuracy"] > 0.55 and (tmp_path / "weights.png").exists()


def test_gmm_frontier_bench_tiny():
    from genvi_experiments.bench.frontier import gmm as frontier_gmm
    lab = frontier_gmm.main(["--points", "200", "--batch", "16", "--samples", "40",
                             "--rounds", "1", "--strategies", "RLOO(2)", "MVD",
                             "--train-seconds", "0.01", "--seeds", "1"])
    assert tuple(lab.labels) == ("RLOO(2)", "MVD")
    assert set(lab.leaves) == {"bias", "loc", "log_scale", "sharp"}
    assert all(np.isfinite(v) for per in lab.variance.values() for v in per.values())


def test_air_frontier_time_to_target_tiny():
    from genvi_experiments.bench.frontier import air as frontier_air
    runs = frontier_air.main(["--time-to-target", "1", "--seeds", "1", "--strategies", "RLOO(2)",
                              "RELAX", "--canvases", "8", "--train-batch", "2"])
    # past its budget after the first chunk of 50 steps: one point, (seconds, objective);
    # RELAX's surrogate (an absent object's presence is certain) trains in the same step
    for label in ("RLOO(2)", "RELAX"):
        (points,) = runs[label]
        assert len(points) >= 1 and all(np.isfinite(v) and t > 0 for t, v in points)


def test_time_to_target_reads_the_trajectories():
    from genvi_experiments.bench.frontier.harness import _ratio, time_to_target
    # seconds, training objective: "fast" reaches -1 at 2 s; "slow" plateaus below it
    runs = {"fast": [[(1.0, -5.0), (2.0, -1.0), (4.0, -0.5), (8.0, -0.4)]],
            "slow": [[(1.0, -9.0), (8.0, -2.0)]]}
    target, reach = time_to_target(runs)   # what "fast" had reached at 2 s of its 8
    assert target == -1.0 and reach == {"fast": [2.0], "slow": [math.inf]}
    assert _ratio(math.inf, 2.0, 8.0) == "> 4.0" and _ratio(3.0, 2.0, 8.0) == "1.50"


def test_time_to_target_records_the_objective_at_the_budget(tmp_path, monkeypatch):
    from genvi_experiments.bench import results
    from genvi_experiments.bench.frontier import harness as frontier
    # two starts each; "stops" ended at a non-finite gradient before the budget (8 s)
    runs = {"fast": [[(1.0, -5.0), (2.0, -1.0), (8.5, -0.5)], [(4.0, -2.0), (8.1, -1.5)]],
            "stops": [[(1.0, -9.0), (3.0, -4.0)], [(2.0, -6.0), (8.2, -2.0)]]}
    monkeypatch.setattr(results, "_RESULTS_ELSEWHERE", str(tmp_path))
    frontier.record_time_to_target("ttt", "frontier_air", runs, 8.0, [], 4, chunk=10)
    table = json.loads((tmp_path / f"{results.on_platform('ttt')}.json").read_text())
    assert table["columns"][-1] == "training objective after 8 s"
    assert [row[-1] for row in table["rows"]] == ["-1.00 ± 0.50", "-3.00 ± 1.00"]


class _Quadratic:
    """A frontier model in one parameter: the training objective -E[(x - 3)²],
    x ~ N(mu, 1), climbs from -10 towards its optimum -1."""

    lr = 0.1

    def init(self, key):
        return {"mu": jnp.zeros(())}

    def objective(self, strategy):
        @gv.expectation
        def e(params, data):
            x = gv.sample(gv.normal(params["mu"], 1.0, grad=strategy), name="x")
            return -jnp.mean((x - data) ** 2)
        return e


@pytest.fixture
def chunk_clock(monkeypatch):
    """The frontier's clock, read once as a fit starts and once at each chunk's end,
    advancing 0.1 s a reading: a run's seconds count its chunks, so a limit is a number
    of chunks and no test depends on how fast the machine compiles and trains (a
    3-second limit on wall-clock time was passed before the first level on a loaded
    CI machine)."""
    from genvi_experiments.bench.frontier import harness as frontier
    readings = itertools.count()
    monkeypatch.setattr(frontier, "time",
                        types.SimpleNamespace(perf_counter=lambda: 0.1 * next(readings)))


def test_runs_to_level_stops_at_the_level_at_the_same_step_each_time(chunk_clock):
    from genvi_experiments.bench.frontier.harness import runs_to_level
    data, strategies = jnp.full((16,), 3.0), {"REPARAM": gv.REPARAM, "RLOO(2)": gv.RLOO(2)}
    first, again = (runs_to_level(_Quadratic(), strategies, -2.0, 60.0, data, seeds=2, batch=4,
                                  window=10, chunk=10) for _ in range(2))
    for label in strategies:
        for (steps, seconds), (steps_again, _) in zip(first[label], again[label]):
            assert steps is not None and steps > 10 and 0 < seconds < 60
            assert steps == steps_again   # a start's estimates: the same on every run
    # above the optimum: never reached, the run ends at its limit
    never = runs_to_level(_Quadratic(), {"REPARAM": gv.REPARAM}, 0.0, 0.5, data, seeds=1,
                          batch=4, window=10, chunk=10)
    assert never == {"REPARAM": [(None, math.inf)]}


def test_runs_to_levels_measure_every_level_on_the_same_starts(tmp_path, monkeypatch,
                                                               chunk_clock):
    from genvi_experiments.bench import results
    from genvi_experiments.bench.frontier import harness as frontier
    data, strategies = jnp.full((16,), 3.0), {"REPARAM": gv.REPARAM, "AUTO": gv.AUTO}
    runs = frontier.runs_to_levels(_Quadratic(), strategies, [-4.0, -2.0, 0.0], 3.0, data,
                                   seeds=2, batch=4, window=10, chunk=10)
    one = frontier.runs_to_level(_Quadratic(), {"REPARAM": gv.REPARAM}, -2.0, 60.0, data,
                                 seeds=2, batch=4, window=10, chunk=10)
    for start, (steps, _) in zip(runs["REPARAM"], one["REPARAM"]):
        (low, t_low), (high, t_high), never = start
        assert 10 <= low < high and 0 < t_low <= t_high < 3.0
        assert high == steps          # the same start, whether it stops there or goes on
        assert never == (None, math.inf)    # above the optimum: the run ends at the limit
    monkeypatch.setattr(results, "_RESULTS_ELSEWHERE", str(tmp_path))
    frontier.record_runs_to_levels("levels", "frontier_air", runs, [-4.0, -2.0, 0.0], 3.0,
                                   [], 4, 10, 0.1)
    table = json.loads((tmp_path / f"{results.on_platform('levels')}.json").read_text())
    assert [row[0] for row in table["rows"]] == ["-4", "-2", "0"]
    assert table["rows"][2][1:3] == ["–; 0 of 2", "–; 0 of 2"]
    starts = json.loads((tmp_path / f"{results.on_platform('levels_starts')}.json").read_text())
    assert len(starts["rows"]) == 6 and starts["rows"][4][2] == "–, –"


def test_enumeration_bench_tiny():
    # the HMM only: its scan is the harder path; a plate's enumeration and ENUM are
    # covered by tests/test_enumeration.py and tests/test_lane_local.py
    from genvi_experiments.bench.enumeration import mixture_hmm as enumeration
    out = enumeration.main(["--steps-hmm", "8", "--fit-steps", "5", "--rounds", "1",
                            "--models", "hmm"])
    assert set(out) == {"hmm"}
    for rows in out.values():
        assert set(rows) == {"enumeration in the model", "ENUM in the guide",
                             "NumPyro TraceEnum_ELBO", "NumPyro TraceEnum_ELBO, markov loop",
                             "NumPyro exact enumeration"}
        assert all(t > 0 and math.isfinite(err) for t, err, _ in rows.values())
        # genvi's enumerated log density, NumPyro's TraceEnum_ELBO of a markov loop and
        # its exact enumeration are the log marginal at the true parameters (the bench
        # reports the scan's TraceEnum_ELBO value too)
        for name in ("enumeration in the model", "NumPyro TraceEnum_ELBO, markov loop",
                     "NumPyro exact enumeration"):
            assert abs(rows[name][2]) < 1e-3 * 8, (name, rows[name][2])


def test_nested_plates_bench_tiny():
    from genvi_experiments.bench.enumeration import plates as enumeration_plates
    out = enumeration_plates.main(["--groups", "4", "--members", "3", "--rounds", "1"])
    assert set(out["times"]) == {"genvi enumeration", "NumPyro TraceEnum_ELBO"}
    # both methods' log densities at the true means are the exact one (numpy)
    assert all(abs(off) < 1e-3 for off in out["offsets"].values()), out["offsets"]


def test_air_compile_reads_xla_phases_from_the_profiler(tmp_path):
    """`air.compile --phases` reads XLA:CPU's compile phases from the profiler's trace
    events; their names belong to the pinned jaxlib, so a version that renames them
    fails here rather than printing zeros."""
    import jax
    import jax.numpy as jnp

    from genvi_experiments.bench.air.compile import xla_phases

    # a constant no earlier run compiled, so that XLA compiles the program here rather
    # than the tests' persistent cache (conftest.py) returning it: the cache keeps a
    # program that took a loaded machine longer than its threshold to compile
    salt = 2.0 + time.time_ns() % 1_000_003
    lowered = jax.jit(lambda x: jnp.tanh(x @ x.T).sum(0) * salt).lower(jnp.ones((8, 8)))
    with jax.profiler.trace(str(tmp_path)):
        lowered.compile()
    phases = xla_phases(str(tmp_path))
    if jax.default_backend() == "cpu":
        assert phases["kernels"] >= 1 and phases["ms_per_kernel"] > 0
        assert phases["hlo_passes"] > 0 and phases["codegen"] > 0


def test_stochastic_volatility_bench_tiny():
    from genvi_experiments.bench.peers import stochastic_volatility
    out = stochastic_volatility.main(["--steps", "30", "--rounds", "1"])
    assert len(out) == 12 and all(t > 0 for t in out.values())   # 3 systems × 2 guides × 2


def test_guide_starts_bench_tiny():
    from genvi_experiments.bench.peers import guide_starts
    out = guide_starts.main(["--days", "30", "--steps", "20", "--draws", "10", "--seeds", "2"])
    assert len(out) == 6 and all(v.shape == (2,) for v in out.values())


def test_horseshoe_bench_tiny():
    from genvi_experiments.bench.peers import horseshoe
    out = horseshoe.main(["--points", "40", "--dims", "6", "--rounds", "1", "--steps", "20",
                          "--seeds", "2"])
    assert out["ratio"] > 0 and all(v.shape == (2,) for v in out["fits"].values())


def test_discrete_vae_bench_tiny():
    from genvi_experiments.bench.frontier import discrete_vae
    labs = discrete_vae.main(["--batch", "4", "--samples", "40", "--rounds", "1",
                              "--strategies", "REINFORCE", "MVD", "--train-seconds", "0.01",
                              "--seeds", "1"])
    assert set(labs) == {"binary", "categorical"}
    # (40 estimates are too few for the bias check on REINFORCE's heavy tails)
    assert all(tuple(lab.labels) == ("REINFORCE", "MVD") and
               all(np.isfinite(v) for per in lab.variance.values() for v in per.values())
               for lab in labs.values())


def test_binary_plate_forms_bench_tiny():
    from genvi_experiments.bench.replays import binary_plate_forms
    rows = binary_plate_forms.main(["--sizes", "8", "--estimates", "200", "--rounds", "1"])
    by_name = {r["name"]: r for r in rows}
    assert len(rows) == 8 and all(r["ms"] > 0 for r in rows)
    # the rest couples a datapoint's lanes: the default pairs each datapoint's vector
    # whole, one lane-local replay per datapoint
    for strategy in ("DisARM", "RELAX"):
        assert by_name[f"{strategy} (default)"]["replays"] == "1 × 8 lanes: lane-local"
        assert "1 × 16 lanes: lane-local" in by_name[f"{strategy}.per_lane()"]["replays"]


def test_from_numpyro_bench_tiny():
    from genvi_experiments.bench.peers import from_numpyro
    out = from_numpyro.main(["--examples", "eight_schools", "mixture", "--steps", "20",
                             "--seeds", "1", "--rounds", "1", "--draws", "10"])
    assert set(out) == {"eight_schools", "mixture"}
    assert all(np.isfinite(v).all() for r in out.values() for v in r["elbo"].values())


def test_autoguides_bench_tiny():
    from genvi_experiments.bench.peers import autoguides
    out = autoguides.main(["--examples", "eight_schools", "--guides", "AutoDiagonalNormal",
                           "--steps", "20", "--seeds", "1", "--rounds", "1", "--draws", "10"])
    assert set(out) == {("eight_schools", "AutoDiagonalNormal")}
    assert all(np.isfinite(v).all() for r in out.values() for v in r["elbo"].values())
