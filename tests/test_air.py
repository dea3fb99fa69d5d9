"""AIR experiment: data, spatial transformer against a direct computation, the
truncated geometric prior, masking in model and guide, every estimator for a few
steps (finite gradients), the CLI end to end at a tiny size."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import genvi as gv
from genvi_experiments.air.config import AIRConfig, pres_prior_probs
from genvi_experiments.air.data import make_canvases
from genvi_experiments.air.estimators import ESTIMATORS, air_objective
from genvi_experiments.air.figures import box_corners
from genvi_experiments.air.model import AIRNets, air_programs
from genvi_experiments.air.spatial import image_to_window, window_to_image
from genvi_experiments.air.train import train_air

TINY = AIRConfig(rnn_hidden=16, predict_hidden=8, encoder_hidden=8, decoder_hidden=8,
                 baseline_hidden=8, z_what=4, window=6, canvas=20)


def direct_sample(source, scale, sx, sy, out_size):
    """grid_sample by its definition, pixel by pixel: output (i, j) reads the source at
    normalized (scale·u_j + sx, scale·u_i + sy), bilinear, zero outside."""
    h, w = source.shape
    out = np.zeros((out_size, out_size))
    for i in range(out_size):
        for j in range(out_size):
            u, v = (2 * j + 1) / out_size - 1, (2 * i + 1) / out_size - 1
            px = ((scale * u + sx + 1) * w - 1) / 2
            py = ((scale * v + sy + 1) * h - 1) / 2
            x0, y0 = int(np.floor(px)), int(np.floor(py))
            for yy in (y0, y0 + 1):
                for xx in (x0, x0 + 1):
                    if 0 <= yy < h and 0 <= xx < w:
                        out[i, j] += (1 - abs(px - xx)) * (1 - abs(py - yy)) * source[yy, xx]
    return out


@pytest.mark.parametrize("where", [(2.0, 0.0, 0.0), (3.1, 0.7, -1.2), (1.3, -0.4, 0.9)])
def test_spatial_transformer_matches_direct_bilinear_sampling(where):
    rng = np.random.default_rng(0)
    window, image = rng.random((7, 7)), rng.random((19, 19))
    s, x, y = where
    got = np.asarray(window_to_image(jnp.array(where), jnp.asarray(window), 19))
    np.testing.assert_allclose(got, direct_sample(window, s, x, y, 19), atol=1e-5)
    got = np.asarray(image_to_window(jnp.array(where), jnp.asarray(image), 7))
    np.testing.assert_allclose(got, direct_sample(image, 1 / s, -x / s, -y / s, 7), atol=1e-5)


def test_spatial_transformer_matches_torch_grid_sample():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(1)
    window = rng.random((8, 8)).astype(np.float32)
    s, x, y = 2.5, 0.3, -0.6
    theta = torch.tensor([[[s, 0.0, x], [0.0, s, y]]])
    grid = torch.nn.functional.affine_grid(theta, [1, 1, 30, 30], align_corners=False)
    want = torch.nn.functional.grid_sample(torch.from_numpy(window)[None, None], grid,
                                           align_corners=False)[0, 0].numpy()
    got = np.asarray(window_to_image(jnp.array([s, x, y]), jnp.asarray(window), 30))
    np.testing.assert_allclose(got, want, atol=1e-5)


def test_spatial_transformer_gradient_is_finite_and_nonzero():
    image = jnp.asarray(np.random.default_rng(2).random((20, 20)))
    g = jax.grad(lambda w: jnp.sum(image_to_window(w, image, 6) ** 2))(jnp.array([2.0, 0.1, 0.2]))
    assert bool(jnp.all(jnp.isfinite(g))) and float(jnp.abs(g).sum()) > 0


def test_box_of_a_window_is_where_the_window_lands():
    where = jnp.array([2.5, 0.5, -0.5])
    image = np.asarray(window_to_image(where, jnp.ones((10, 10)), 50))
    left, top, side = box_corners(np.asarray(where), 50)
    rows, cols = np.nonzero(image > 0.5)
    assert abs(cols.min() - left) <= 1 and abs(rows.min() - top) <= 1
    assert abs(cols.max() + 1 - (left + side)) <= 1 and abs(rows.max() + 1 - (top + side)) <= 1


def test_truncated_geometric_prior():
    k = 0.3
    probs = pres_prior_probs(k, 3)
    count = [np.prod(probs[:n]) * (1 - probs[n] if n < 3 else 1) for n in range(4)]
    np.testing.assert_allclose(np.array(count) / count[0], [k ** n for n in range(4)], rtol=1e-6)
    with pytest.raises(ValueError, match="ratio"):
        pres_prior_probs(0.0, 3)


def test_canvases_are_reproducible_and_hold_their_counts():
    a, b = make_canvases(train=60, test=20, seed=3), make_canvases(train=60, test=20, seed=3)
    np.testing.assert_array_equal(a.train, b.train)
    assert a.train.shape == (60, 50, 50) and set(np.unique(a.train_counts)) <= {0, 1, 2}
    empty = a.train_counts == 0
    assert np.all(a.train[empty] == 0) and np.all(a.train[~empty].sum((1, 2)) > 1)
    assert 0.0 <= a.train.min() and a.train.max() <= 1.0
    with pytest.raises(ValueError, match="digit_sizes"):
        make_canvases(train=2, test=2, digit_sizes=(30, 60))


def _programs():
    nets = AIRNets(TINY)
    return nets, nets.init(jax.random.key(0)), *air_programs(TINY, nets, lambda t, i: gv.REINFORCE)


def test_absent_objects_are_masked_in_model_and_guide():
    nets, params, model, guide = _programs()
    image = jnp.asarray(np.random.default_rng(0).random((20, 20)), jnp.float32)
    for seed in range(20):  # find a trace with an absent step
        trace = guide.simulate(jax.random.key(seed), params, image)
        pres = np.asarray(trace.choices["steps", "z_pres"])
        if not pres.all():
            break
    assert not pres.all() and list(pres) == sorted(pres, reverse=True)  # absent stays absent
    absent = ~pres
    flat = dict(trace.choices.flat())
    changed = dict(flat)
    for addr in (("steps", "z_where"), ("steps", "z_what")):
        changed[addr] = jnp.where(absent[:, None], flat[addr] + 5.0, flat[addr])
    for program in (model, guide):
        before = program.log_density(trace.choices, params, image)
        after = program.log_density(gv.choices(_nest(changed)), params, image)
        assert float(before) == pytest.approx(float(after), rel=1e-6)


def _nest(flat):
    out = {}
    for addr, v in flat.items():
        d = out
        for a in addr[:-1]:
            d = d.setdefault(a, {})
        d[addr[-1]] = v
    return out


def test_model_simulates_canvases_of_the_right_shape():
    nets, params, model, guide = _programs()
    trace = model.simulate(jax.random.key(0), params, jnp.zeros((20, 20)))
    assert trace.retval.shape == (20, 20)
    assert trace.choices["steps", "z_where"].shape == (3, 3)
    assert trace.choices["steps", "z_what"].shape == (3, 4)


@pytest.mark.parametrize("name", list(ESTIMATORS))
def test_every_estimator_trains_with_finite_gradients(name):
    nets = AIRNets(TINY)
    objective, _, _ = air_objective(TINY, nets, name)
    params = nets.init(jax.random.key(0), baseline=ESTIMATORS[name].baseline)
    images = jnp.asarray(make_canvases(train=8, test=1, canvas=20, digit_sizes=(6, 9)).train)
    value, grads = jax.jit(objective.value_and_grad_estimate)(jax.random.key(1), params, images)
    assert np.isfinite(float(value))
    leaves = jax.tree_util.tree_leaves(grads["guide"])
    assert all(bool(jnp.all(jnp.isfinite(g))) for g in leaves)
    assert any(float(jnp.abs(g).max()) > 0 for g in leaves)
    if ESTIMATORS[name].baseline:  # the learned baseline gets a gradient
        assert float(jnp.abs(grads["baseline"]["predict"]["dense1"]["bias"]).max()) > 0


def test_enum_replays_are_whole_because_the_rnn_carries_every_step():
    """The guide's LSTM carries each step's z_pres into every later step, so a replay
    that changes it reruns the rest of the scan; explain names that carry as the reason
    (the docs' account of AIR's ENUM step cost)."""
    nets = AIRNets(TINY)
    objective, _, _ = air_objective(TINY, nets, "enum")
    images = jnp.asarray(make_canvases(train=4, test=1, canvas=20, digit_sizes=(6, 9)).train)
    sites = {s["addr"]: s for s in objective.explain(nets.init(jax.random.key(0)),
                                                        images).sites}
    assert sites["steps/z_pres"]["replays"].endswith(
        "whole-objective replays, after the scan; not Markov-local: a scan carry that keeps "
        "a step's value"), sites["steps/z_pres"]["replays"]


def test_train_air_logs_accuracy_and_elbo():
    data = make_canvases(train=32, test=16, canvas=20, digit_sizes=(6, 9))
    run = train_air(dataclasses.replace(TINY), data, "mvd", steps=4, chunk=2, batch_size=8,
                    eval_size=16)
    assert [r["step"] for r in run["log"]] == [0, 2, 4]
    assert all(0 <= r["accuracy"] <= 1 and np.isfinite(r["elbo"]) for r in run["log"])


def test_air_cli_end_to_end(tmp_path):
    from genvi.cli import main
    # two of the cheapest estimators to compile; every estimator trains in
    # test_every_estimator_trains_with_finite_gradients
    assert main(["run", "air", "--estimators", "sd", "baseline", "--steps", "2", "--chunk", "2",
                 "--train-size", "32", "--test-size", "8", "--rnn-hidden", "8", "--hidden", "8",
                 "--z-what", "4", "--out", str(tmp_path)]) == 0
    table = (tmp_path / "results.md").read_text()
    assert "| sd |" in table and "| baseline |" in table
    assert (tmp_path / "curves.png").exists() and (tmp_path / "reconstructions_sd.png").exists()


def test_projected_lstm_step_equals_flax_lstm_cell():
    nets = AIRNets(TINY)
    params = nets.init(jax.random.key(0))["guide"]["rnn"]
    rng = np.random.default_rng(0)
    image = jnp.asarray(rng.random(TINY.canvas ** 2), jnp.float32)
    latents = jnp.asarray(rng.normal(size=3 + TINY.z_what + 1), jnp.float32)
    state = tuple(jnp.asarray(rng.normal(size=TINY.rnn_hidden), jnp.float32) for _ in range(2))
    want = nets.step_rnn(params, state, jnp.concatenate([image, latents]))
    got = nets.step_rnn_projected(nets.project_image(params, image), state, latents)
    for a, b in zip(want, got):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)


def test_pyro_air_runs_and_its_hoisted_lstm_equals_torch_lstm_cell():
    torch = pytest.importorskip("torch")
    pytest.importorskip("pyro")
    from genvi_experiments.bench.air.in_pyro import _lstm, _lstm_projected, _project, pyro_air_counts, pyro_air_step
    cell = torch.nn.LSTMCell(20 + 5, 8)
    image, latents = torch.randn(3, 20), [torch.randn(3, 2), torch.randn(3, 3)]
    h, c = torch.randn(3, 8), torch.randn(3, 8)
    with torch.no_grad():
        for a, b in zip(_lstm(cell, [image] + latents, h, c),
                        _lstm_projected(cell, _project(cell, image), latents, h, c)):
            np.testing.assert_allclose(a.numpy(), b.numpy(), atol=1e-5)
    data = make_canvases(train=8, test=4, canvas=20, digit_sizes=(6, 9))
    for name in ("tracegraph", "tracegraph_baselines", "traceenum"):
        step = pyro_air_step(TINY, name)
        assert np.isfinite(step(data.train))
    assert pyro_air_counts(step.air, data.test).shape == (4,)


def test_canvas_digits_are_enlarged_as_jax_resizes_them_and_overlap_little():
    from genvi_experiments.air.data import _overlap, bilinear_matrix
    img = np.random.default_rng(0).random((8, 8)).astype(np.float32)
    for size in (5, 6, 7, 8, 12, 20):
        w = bilinear_matrix(8, size)
        np.testing.assert_allclose(w @ img @ w.T, jax.image.resize(jnp.asarray(img), (size, size),
                                                                   "bilinear"), atol=1e-5)
    # two digits of one canvas: vectorized rejection keeps their boxes' overlap small
    rng = np.random.default_rng(1)
    from genvi_experiments.air.data import _positions
    owner, sizes = np.arange(500), rng.integers(12, 21, 500)
    first = _positions(rng, owner, sizes, 50, 0.1, [])
    second_sizes = rng.integers(12, 21, 500)
    second = _positions(rng, owner, second_sizes, 50, 0.1, [(owner, sizes, *first)])
    assert np.all(_overlap(*second, second_sizes, *first, sizes) <= 0.1)


def test_air_presets_fill_only_what_was_not_given():
    from genvi_experiments.air.run import DEFAULT_ESTIMATORS, PAPER_ESTIMATORS, parse_args
    default, quick, full = parse_args([]), parse_args(["--quick"]), parse_args(["--all"])
    assert (default.estimators, default.minutes, default.steps) == (DEFAULT_ESTIMATORS, 2.0, None)
    assert (quick.estimators, quick.steps, quick.chunk, quick.test_size) == (["mvd"], 600, 200, 200)
    assert (full.estimators, full.minutes) == (PAPER_ESTIMATORS, 20.0) and len(PAPER_ESTIMATORS) == 8
    mine = parse_args(["--quick", "--estimators", "iwelbo_mvd", "--steps", "500"])
    assert (mine.estimators, mine.steps, mine.minutes) == (["iwelbo_mvd"], 500, None)
    with pytest.raises(SystemExit):
        parse_args(["--quick", "--all"])
