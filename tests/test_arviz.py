"""gv.to_arviz: guide draws and gv.predictive output as ArviZ data (a DataTree on ArviZ
1.x, InferenceData on 0.x), whose summaries are the draws' own, with dims named after the
model's plates; arviz-plots draws it; the PSIS genvi takes from either ArviZ finds the
Pareto shape of known weights."""

import arviz as az
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import genvi as gv
from genvi.inference.arviz_versions import require_arviz

X = jnp.linspace(-1.0, 1.0, 6)
Y = jnp.array([-1.1, -0.4, 0.1, 0.2, 0.9, 1.3])


@gv.gen
def point(w, x, y):
    gv.observe(gv.normal(w[0] + w[1] * x, 0.5), y, name="y")


@gv.gen
def regression(params, x, y):
    w = gv.mv_normal_diag(jnp.zeros(2), jnp.ones(2)) @ "w"
    gv.normal(0.0, 1.0) @ "b"
    gv.plate(point, 6, in_axes=(None, 0, 0))(w, x, y) @ "data"


@gv.gen
def guide(params, x, y):
    gv.mv_normal_diag(params["m"], jnp.ones(2) * 0.3, grad=gv.REPARAM) @ "w"
    gv.normal(0.5, 0.2, grad=gv.REPARAM) @ "b"


PARAMS = {"m": jnp.array([0.1, 1.0])}
ARVIZ = require_arviz("tests")


def groups(data) -> list:
    """The group names of a DataTree (ArviZ 1.x) or an InferenceData (0.x)."""
    names = data.groups() if callable(data.groups) else data.groups
    return sorted(n.strip("/") for n in names if n.strip("/"))


def test_summary_means_are_the_draws_means():
    keys = jax.random.split(jax.random.key(0), 500)
    draws = jax.vmap(lambda k: guide.simulate(k, PARAMS, X, Y).choices)(keys)
    idata = gv.to_arviz(draws)
    summary = az.summary(idata, kind="stats", round_to="none")
    np.testing.assert_allclose(summary.loc["b", "mean"], np.mean(draws["b"]), rtol=1e-6)
    np.testing.assert_allclose(summary.loc[["w[0]", "w[1]"], "mean"], np.mean(draws["w"], 0),
                               rtol=1e-6)
    assert idata.posterior.sizes["chain"] == 1 and idata.posterior.sizes["draw"] == 500


def test_predictive_output_splits_into_groups_with_plate_dims(tmp_path):
    draws = gv.predictive(regression, guide, PARAMS, num_samples=300)(jax.random.key(1), X, Y)
    idata = gv.to_arviz(draws, model=regression, args=(PARAMS, X, Y),
                        observed_data={"data/y": Y})
    assert groups(idata) == ["observed_data", "posterior", "posterior_predictive"]
    assert sorted(idata.posterior.data_vars) == ["b", "w"]
    assert idata.posterior_predictive["data.y"].dims == ("chain", "draw", "data")
    assert idata.observed_data["data.y"].dims == ("data",)
    assert idata.posterior["w"].dims == ("chain", "draw", "w_dim_0")   # an event axis
    np.testing.assert_allclose(idata.posterior_predictive["data.y"].values[0], draws["data", "y"])
    np.testing.assert_allclose(idata.observed_data["data.y"].values, Y)
    summary = az.summary(idata, group="posterior_predictive", kind="stats", round_to="none")
    np.testing.assert_allclose(summary["mean"].values, np.mean(draws["data", "y"], 0), rtol=1e-5)
    idata.to_netcdf(str(tmp_path / "fit.nc"))   # names hold no "/", which netCDF refuses


def test_prior_draws_split_into_prior_groups():
    draws = gv.predictive(regression, None, {}, num_samples=100)(jax.random.key(5), X, Y)
    idata = gv.to_arviz(prior=draws, model=regression, args=({}, X, Y))
    assert groups(idata) == ["prior", "prior_predictive"]
    assert sorted(idata.prior.data_vars) == ["b", "w"]
    assert idata.prior_predictive["data.y"].dims == ("chain", "draw", "data")


def test_given_dims_and_coords_take_precedence():
    draws = gv.predictive(regression, guide, PARAMS, num_samples=50)(jax.random.key(2), X, Y)
    idata = gv.to_arviz(posterior={"w": draws["w"], "b": draws["b"]},
                        posterior_predictive={"data": {"y": draws["data", "y"]}},
                        model=regression, args=(PARAMS, X, Y),
                        dims={"w": ["coef"], "data.y": ["obs"]},
                        coords={"coef": ["intercept", "slope"]})
    assert idata.posterior["w"].dims == ("chain", "draw", "coef")
    assert list(idata.posterior["coef"].values) == ["intercept", "slope"]
    assert idata.posterior_predictive["data.y"].dims == ("chain", "draw", "obs")


def test_resampled_draws_export():
    report = gv.diagnose(regression, guide, PARAMS, X, Y, key=jax.random.key(3), num_samples=400)
    idata = gv.to_arviz(report.resample(jax.random.key(4), 200))
    assert idata.posterior["w"].shape == (1, 200, 2)


def test_bad_input_is_a_clear_error():
    with pytest.raises(ValueError, match="at least one"):
        gv.to_arviz()
    with pytest.raises(ValueError, match="leading axis of the same length"):
        gv.to_arviz({"a": jnp.zeros(10), "b": jnp.zeros(11)})
    with pytest.raises(TypeError, match="choice map or a dict"):
        gv.to_arviz(jnp.zeros(10))
    with pytest.raises(TypeError, match="model must be a @gv.gen program"):
        gv.to_arviz({"a": jnp.zeros(10)}, model=lambda: None)


@pytest.mark.skipif(ARVIZ.major < 1, reason="arviz-plots comes with ArviZ 1.x")
def test_arviz_plots_draws_the_export(tmp_path):
    import matplotlib
    matplotlib.use("Agg")
    import arviz_plots as azp

    draws = gv.predictive(regression, guide, PARAMS, num_samples=200)(jax.random.key(6), X, Y)
    idata = gv.to_arviz(draws, model=regression, args=(PARAMS, X, Y),
                        observed_data={"data/y": Y})
    plots = azp.plot_dist(idata, var_names=["w", "b"], backend="matplotlib")
    plots.savefig(str(tmp_path / "dist.png"))
    assert (tmp_path / "dist.png").stat().st_size > 1000
    ppc = azp.plot_ppc_dist(idata, backend="matplotlib")
    ppc.savefig(str(tmp_path / "ppc.png"))
    assert (tmp_path / "ppc.png").stat().st_size > 1000


@pytest.mark.parametrize("shape", [0.3, 0.8])
def test_psis_finds_the_pareto_shape_of_known_weights(shape):
    # weights w ~ Pareto(1 / shape): log w ~ Exponential(rate 1 / shape), a tail of shape k
    log_w = np.random.default_rng(0).exponential(shape, 40_000)
    smoothed, khat = ARVIZ.psislw(log_w)
    assert abs(khat - shape) < 0.1
    assert abs(np.logaddexp.reduce(smoothed)) < 1e-9          # normalized
    bulk = np.argsort(log_w)[:30_000]                          # below the smoothed tail
    offsets = smoothed[bulk] - log_w[bulk]
    assert np.ptp(offsets) < 1e-9                              # only shifted


def test_numpyro_imports_whole_after_genvi_imports_arviz():
    """ArviZ 1.x leaves a lazy stand-in for NumPyro in sys.modules; NumPyro imported
    submodule-first after it used to be half-built (its `factor` failed with "module
    'numpyro.distributions' has no attribute 'distribution'"). A fresh interpreter, since
    this one may have imported NumPyro already."""
    import subprocess
    import sys
    pytest.importorskip("numpyro")
    code = ("from genvi.inference.arviz_versions import require_arviz\n"
            "require_arviz('gv.diagnose')\n"
            "import numpyro.distributions as dist\n"
            "import numpyro\n"
            "from numpyro import handlers\n"
            "def m():\n"
            "    numpyro.factor('f', 1.0)\n"
            "print(handlers.trace(handlers.seed(m, 0)).get_trace()['f']['type'])\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "sample", out.stderr[-2000:]
