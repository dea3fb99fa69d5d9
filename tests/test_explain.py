"""`objective.explain`: every replay counted (alternatives × lanes × scan steps), and
the steps' work counted with loops at their trip counts, where XLA's FLOPs count each
loop body once. The HMM's guide here is autoregressive, so its ENUM site replays the
objective at each step (a mean-field guide's would be Markov-local:
tests/test_markov_replays.py)."""

import jax
import jax.numpy as jnp

import genvi as gv
from programs import flip_hmm


def hmm_elbo(strategy):
    return gv.elbo(*flip_hmm(strategy, guide_carries_z=True))


def test_runs_count_every_step_of_the_scan():
    for t in (20, 40):
        (entry,) = hmm_elbo(gv.ENUM).explain(jnp.zeros(t), jnp.zeros(t)).sites
        assert entry["runs"] == t and "whole-objective" in entry["replays"]
        (entry,) = hmm_elbo(gv.REINFORCE).explain(jnp.zeros(t), jnp.zeros(t)).sites
        assert entry["runs"] == 0


def test_work_counts_loops_at_their_trip_counts():
    small = hmm_elbo(gv.ENUM).explain(jnp.zeros(20), jnp.zeros(20))
    large = hmm_elbo(gv.ENUM).explain(jnp.zeros(80), jnp.zeros(80))
    # the value grows with T; T whole-objective replays of length T grow as T²
    assert 3.5 < large.work_value[0] / small.work_value[0] < 4.5   # 4× the steps
    assert large.work_gradient[0] / small.work_gradient[0] > 8      # 16× in the limit
    # XLA's compiled count sees each loop body once: it misses the replays' loop
    xla = large.flops_gradient / large.flops_value
    assert xla < 2 and large.work_gradient[0] / large.work_value[0] > 10 * xla
    assert "operations executed" in str(large) and "runs" in str(large)


def test_launches_count_loops_run_kernel_by_kernel():
    """XLA:CPU compiles a loop that touches under 1 KiB per step into one kernel; a
    larger one runs its body kernel by kernel at every step."""
    from genvi.adev.explain import launches

    def loop(carry):
        return jax.lax.scan(lambda c, a: (jnp.sin(c) * a + 1.0, None), carry,
                            jnp.ones(400))[0]

    small, large = (jax.jit(loop).lower(jnp.ones(n)).compile().as_text() for n in (4, 4096))
    if jax.default_backend() == "cpu":
        assert launches(small) < 10
    assert launches(large) >= 400
