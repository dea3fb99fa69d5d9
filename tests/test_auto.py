"""`gv.AUTO`: a site whose strategy genvi chooses. Untuned it takes the first
candidate the objective allows; `gv.tune` measures every candidate's gradient
variance × time per estimate and picks the least; `gv.fit` tunes at its start and
every `retune_every` steps (`gv.AutoTuning`) and records each tuning. It picks REPARAM at a smooth
Gaussian site, never REPARAM where the continuation is discontinuous, the strategy
the estimator lab ranks first where the ranking is clear, and RLOO with a measured
number of samples where REINFORCE is the only strategy; the estimate it runs is
unbiased. While a fit measures, it trains with the untuned choice where that step is
cheap, else with the cheapest candidate by the cost model."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import genvi as gv
from estimates import within
from genvi.auto.choices import candidates
from genvi.auto import tune
from genvi.auto import race
from genvi.auto.report import Measured
from genvi.auto.race import race as _run
from genvi.auto.tune import starting_choices
from programs import model

KEY = jax.random.key(0)
QUICK = dict(estimates=32)


def smooth():
    @gv.expectation
    def e(mu):  # nearly linear in x: the pathwise gradient has almost no variance
        x = gv.sample(gv.normal(mu + jnp.arange(8.0), 1.0, grad=gv.AUTO), name="x")
        return jnp.sum(3.0 * x - 0.05 * x ** 2)
    return e


def step():
    @gv.expectation
    def e(mu):  # a step of x: REPARAM would see a zero derivative almost everywhere
        x = gv.sample(gv.normal(mu, 1.0, grad=gv.AUTO), name="x")
        return jnp.where(x > 0.0, 1.0, 0.0)
    return e


def test_candidates_follow_the_distribution():
    assert candidates(gv.normal) == (gv.REPARAM, gv.RLOO(2), gv.MVD)
    assert candidates(gv.flip) == (gv.ENUM, gv.RLOO(2), gv.MVD, gv.DisARM, gv.SD)
    assert candidates(gv.categorical) == (gv.ENUM, gv.RLOO(2), gv.MVD, gv.SD)
    assert candidates(gv.uniform) == (gv.REPARAM,)


def test_picks_reparam_at_a_smooth_gaussian_site():
    tuning = gv.tune(smooth(), 0.0, key=KEY, **QUICK)
    assert tuning.choice("x") == gv.REPARAM, tuning
    rows = {repr(m.strategy): m for m in tuning.measured}
    assert rows["gv.REPARAM"].variance < 0.1 * min(rows["gv.MVD"].variance,
                                                   rows["gv.RLOO(2)"].variance)


def test_refuses_reparam_where_the_continuation_is_discontinuous():
    e = step()
    # untuned: the first candidate allowed, and explain says why REPARAM is not it
    text = str(e.explain(0.0))
    assert "gv.AUTO (untuned) → gv.RLOO(2)" in text and "gv.REPARAM refused" in text
    tuning = gv.tune(e, 0.0, key=KEY, **QUICK)
    rows = {repr(m.strategy): m for m in tuning.measured}
    assert rows["gv.REPARAM"].refused and "discontinuity" in rows["gv.REPARAM"].refused
    assert tuning.choice("x") != gv.REPARAM


def test_picks_what_the_lab_ranks_first():
    # MVD is exact for E 1[x > 0] (variance 0); RLOO(2) is not
    e = step()
    tuning = gv.tune(e, 0.0, key=KEY, **QUICK)
    lab = gv.compare_estimators({"RLOO(2)": gv.RLOO(2), "MVD": gv.MVD}, KEY, 0.0,
                                make=lambda s: _step_with(s), samples=2000, rounds=3)
    work = {a: lab.variance[a][lab.leaves[0]] * lab.seconds[a] for a in lab.labels}
    assert min(work, key=work.get) == "MVD"
    assert tuning.choice("x") == gv.MVD, tuning


def _step_with(strategy):
    @gv.expectation
    def e(mu):
        x = gv.sample(gv.normal(mu, 1.0, grad=strategy), name="x")
        return jnp.where(x > 0.0, 1.0, 0.0)
    return e


class Counts(gv.Distribution):
    """A distribution that supports only REINFORCE (no support, MVD terms or
    reparameterization)."""

    name = "counts"

    def sample(self, key, rate):
        return gv.poisson.sample(key, rate)

    def lane_log_prob(self, x, rate):
        return gv.poisson.lane_log_prob(x, rate)


def test_only_reinforce_takes_rloo_with_a_measured_number_of_samples():
    counts = Counts()
    assert candidates(counts) == (gv.RLOO(2), gv.RLOO(4), gv.RLOO(8))

    @gv.expectation
    def e(rate):
        n = gv.sample(counts(rate, grad=gv.AUTO), name="n")
        return jnp.sqrt(n * 1.0)
    tuning = gv.tune(e, 3.0, key=KEY, **QUICK)
    assert tuning.choice("n") in (gv.RLOO(2), gv.RLOO(4), gv.RLOO(8))
    assert "supports only REINFORCE" in str(tuning)


def test_the_tuned_estimate_is_unbiased():
    e = step()
    tuned = gv.tune(e, 0.3, key=KEY, **QUICK).apply(e)
    keys = jax.random.split(jax.random.key(1), 20_000)
    g = np.asarray(jax.jit(jax.vmap(lambda k: tuned.grad_estimate(k, 0.3)))(keys), np.float64)
    exact = math.exp(-0.3 ** 2 / 2) / math.sqrt(2 * math.pi)  # d/dμ P(x > 0)
    assert within(g.mean(), g.std() / math.sqrt(len(g)) + 1e-6, exact)


def test_fit_tunes_at_the_start_and_when_asked():
    guide = _guide_with(gv.AUTO)  # the conjugate pair of tests/programs.py, AUTO at z
    result = gv.fit(gv.elbo(model, guide), {"m": 0.0, "s": 0.0}, 1.0,
                    optimizer=optax.adam(0.05), steps=300, key=KEY, progress=False,
                    callbacks=[gv.AutoTuning(retune_every=100)])
    assert [t.step for t in result.tunings] == [0, 100, 200]
    assert all(t.choice("z") in candidates(gv.normal) for t in result.tunings)
    assert float(result.params["m"]) == pytest.approx(0.5, abs=0.15)  # the posterior mean
    text = str(result.tunings[0])
    assert "chosen" in text and "gv.REPARAM" in text and "gv.MVD" in text
    # a continued fit measures again at its start and keeps the earlier tunings
    more = gv.fit(gv.elbo(model, guide), result, 1.0, optimizer=optax.adam(0.05), steps=20,
                  progress=False)
    assert [t.step for t in more.tunings] == [0, 100, 200, 300]
    # without AUTO sites there is nothing to retune
    with pytest.raises(ValueError, match="retune_every= measures the strategies of sites "
                                         "with grad=gv.AUTO"):
        gv.fit(gv.elbo(model, _guide_with(gv.REPARAM)), {"m": 0.0, "s": 0.0}, 1.0,
               optimizer=optax.adam(0.05), steps=10, key=KEY, progress=False,
               callbacks=[gv.AutoTuning(retune_every=5)])


def _guide_with(strategy):
    @gv.gen
    def guide(p, y):
        gv.normal(p["m"], jnp.exp(p["s"]), grad=strategy) @ "z"
    return guide


def test_explain_prints_the_choice_and_the_table():
    e = smooth()
    tuning = gv.tune(e, 0.0, key=KEY, **QUICK)
    text = str(tuning.apply(e).explain(0.0))
    assert "gv.AUTO → gv.REPARAM" in text
    assert "gv.AUTO, measured at step 0" in text and "variance × seconds" in text


def test_explain_lists_each_untuned_site_once_in_any_objective():
    # the trial traces that find the untuned choices leave no rows in explain's table,
    # and an objective built on a program (gv.batch_mean) marks its untuned sites too
    @gv.expectation
    def e(p):
        x = gv.sample(gv.normal(p, 1.0, grad=gv.AUTO), name="x")
        a = gv.sample(gv.flip(jax.nn.sigmoid(p + x), grad=gv.AUTO), name="a")
        return jnp.where(a, 1.0, -1.0) * x
    for _ in range(2):   # the first call finds the choices, the second reuses them
        rows = [(r["addr"], r["strategy"]) for r in e.explain(0.4).sites]
        assert rows == [("x", "gv.AUTO (untuned) → gv.REPARAM"),
                        ("a", "gv.AUTO (untuned) → gv.ENUM")]

    @gv.gen
    def guide(p, y):
        gv.normal(p["m"] * y, 1.0, grad=gv.AUTO) @ "z"

    @gv.gen
    def prior(p, y):
        z = gv.normal(0.0, 1.0) @ "z"
        gv.observe(gv.normal(z, 1.0), y)
    text = str(gv.batch_mean(gv.elbo(prior, guide)).explain({"m": 0.3}, jnp.ones(4)))
    assert "gv.AUTO (untuned) → gv.REPARAM" in text
    assert "gv.AUTO at 'z' untuned: gv.REPARAM" in text


def test_two_sites_are_tuned_one_after_the_other():
    @gv.expectation
    def e(p):
        a = gv.sample(gv.flip(p, grad=gv.AUTO), name="a")
        x = gv.sample(gv.normal(p * a, 1.0, grad=gv.AUTO), name="x")
        return jnp.where(a, 1.0, -1.0) * x
    tuning = gv.tune(e, 0.4, key=KEY, **QUICK)
    assert {a for a, _ in tuning.choices} == {("a",), ("x",)}
    assert {m.site for m in tuning.measured} == {"a", "x"}


def test_refusals():
    @gv.expectation
    def unnamed(mu):
        return gv.sample(gv.normal(mu, 1.0, grad=gv.AUTO))
    with pytest.raises(ValueError, match=r"grad=gv.AUTO at an unnamed gv.sample of gv.normal"):
        unnamed.grad_estimate(KEY, 0.0)

    @gv.expectation
    def none(mu):
        return gv.sample(gv.normal(mu, 1.0, grad=gv.REPARAM))
    with pytest.raises(ValueError, match="no site with grad=gv.AUTO"):
        gv.tune(none, 0.0, key=KEY)
    with pytest.raises(KeyError, match="no gv.AUTO site at 'y'"):
        gv.tune(step(), 0.0, key=KEY, **QUICK).choice("y")


def test_a_candidate_whose_estimates_are_not_finite_is_ruled_out():
    # f(0) = −∞ at probability 10⁻⁶: ENUM and MVD evaluate it and their estimates are
    # not finite; RLOO(2) and the DisARMs (almost) never draw it. The candidates run in
    # one compiled program, so one branch's NaNs must not reach the others' rows.
    @gv.expectation
    def e(logit):
        b = gv.sample(gv.flip(jax.nn.sigmoid(logit), grad=gv.AUTO), name="b")
        return jnp.where(b, 1.0, -jnp.inf)
    tuning = gv.tune(e, jnp.float32(13.8), key=KEY, **QUICK)
    rows = {repr(m.strategy): m for m in tuning.measured}
    for name in ("gv.ENUM", "gv.MVD"):
        assert rows[name].refused == "its gradient estimates are not finite here", rows[name]
    assert rows["gv.RLOO(2)"].refused is None and math.isfinite(rows["gv.RLOO(2)"].variance)
    assert tuning.choice("b") not in (gv.ENUM, gv.MVD)


def test_a_fit_starts_with_a_cheap_step_while_it_measures():
    # untuned choices whose step costs a few of the score function's are kept
    assert starting_choices(smooth(), (0.0,), KEY, {}) == ((("x",), gv.REPARAM),)
    assert starting_choices(step(), (0.0,), KEY, {}) == ((("x",), gv.RLOO(2)),)
    # 32 flips coupled by a dense layer: ENUM's and MVD's replays evaluate the layer
    # once per lane (22 times the score function's elements), and the first candidate
    # in rank order whose step is cheap is taken instead: DisARM, whole-site here
    w = jax.random.normal(jax.random.key(2), (32, 256))

    @gv.expectation
    def coupled(logits):
        b = gv.sample(gv.bernoulli(logits=logits, grad=gv.AUTO), name="b")
        return jnp.sum(jnp.tanh((b * 1.0) @ w))
    assert starting_choices(coupled, (jnp.zeros(32),), KEY, {}) == ((("b",), gv.DisARM),)
    # the categorical VAE: ENUM 19 times the score function's elements, RLOO(2) 3.4
    from genvi_experiments.bench.frontier.discrete_vae import make_vae
    vae = make_vae("categorical", 64)
    args = (vae.init(KEY), jnp.zeros((8, 64)))
    assert starting_choices(vae.objective(gv.AUTO), args, KEY, {}) == ((("z",), gv.RLOO(2)),)

    # where REINFORCE is all there is: the fewest samples
    @gv.expectation
    def counted(rate):
        n = gv.sample(Counts()(rate, grad=gv.AUTO), name="n")
        return jnp.sum(jnp.tanh((n * 1.0) @ w))
    assert starting_choices(counted, (jnp.full(32, 3.0),), KEY, {}) == ((("n",), gv.RLOO(2)),)


class _Clock:
    """A stand-in for the `time` module that `race.race` reads: its clock moves only
    when a `_timed_program` runs, so a race's rounds depend on the programs' stated
    times, not on how busy the machine is."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch):
    fake = _Clock()
    monkeypatch.setattr(race, "time", fake)
    return fake


def _timed_program(clock, seconds, variances):
    """A stand-in for a site's measuring program: `count` estimates of candidate i take
    `seconds[i]` each on `clock` and measure `variances[i]`."""
    def program(i, keys, count, args):
        clock.now += seconds[i] * count
        return variances[i]
    return program


def test_the_measurement_races_the_candidates(clock):
    keys = jnp.zeros((5, 4))   # a warm-up batch and four of 4 estimates
    # candidate 1's variance × time is 10 times the best's: one batch, then out; the
    # second-best, within twice, races on with the best
    slow = _timed_program(clock, [0.005, 0.005, 0.005], [1.0, 10.0, 1.5])
    taken = [n for _, _, n in _run(slow, 3, (), keys)]
    assert taken == [16, 4, 16]
    # a first round quicker than RACE_FROM: its times rank nothing, every candidate races
    quick = _timed_program(clock, [0.0, 0.0, 0.0], [1.0, 10.0, 1.5])
    assert [n for _, _, n in _run(quick, 3, (), keys)] == [16, 16, 16]
    # alone in the race after the first batch: nothing is left to choose
    lone = _timed_program(clock, [0.008, 0.008], [1.0, 10.0])
    assert [n for _, _, n in _run(lone, 2, (), keys)] == [4, 4]
    # a candidate whose first batch is not finite leaves at once
    broken = _timed_program(clock, [0.0, 0.0], [math.nan, 1.0])
    assert [n for _, _, n in _run(broken, 2, (), keys)] == [4, 4]


def test_a_budgeted_race_sizes_its_batches_to_fit(clock):
    keys = jnp.zeros((5, 32))   # a warm-up batch and four of 32 estimates
    slow = _timed_program(clock, [0.002, 0.002, 0.002], [1.0, 10.0, 1.5])
    # a first round of 32 each (0.19 s) and two further rounds of the two racers
    # (0.13 s each) fit in 0.5 s; a third would not
    assert [n for _, _, n in _run(slow, 3, (), keys, 0.5)] == [96, 32, 96]
    # 0.1 s: batches sized at the warm-up's pace (2 ms an estimate) so that the first
    # round fits (16 each, 0.096 s), and no further round
    assert [n for _, _, n in _run(slow, 3, (), keys, 0.1)] == [16, 16, 16]
    # nothing to spend: the fewest estimates, once
    assert [n for _, _, n in _run(slow, 3, (), keys, 0.0)] == [race.FEWEST] * 3


def test_a_site_keeps_what_training_runs_within_the_margin():
    site = type("Site", (), {"name": "b"})()

    def row(strategy, work):
        return Measured("b", strategy, variance=work, seconds=1.0, estimates=32)
    usable = [row(gv.ENUM, 1.2), row(gv.DisARM, 1.0), row(gv.REINFORCE, 50.0)]
    assert tune._choose(site, usable, None) == (gv.DisARM, "")
    choice, note = tune._choose(site, usable, gv.ENUM)   # 1.2 times the best's: kept
    assert choice == gv.ENUM and "kept gv.ENUM" in note and "1.20 times gv.DisARM" in note
    assert tune._choose(site, usable, gv.REINFORCE) == (gv.DisARM, "")   # far behind
    assert tune._choose(site, usable, gv.DisARM) == (gv.DisARM, "")
