"""genvi changes no rule of JAX's own primitives: the batching, JVP, transpose and
lowering tables hold the same rules before `import genvi`, after it, and after
running objectives and programs with conds (sampling in their branches) under
`gv.plate` and `jax.vmap`. genvi's own batching of such conds is in force only while
genvi traces or interprets a program (`genvi.core.jaxpr.genvi_conds`)."""

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import jax, jax.numpy as jnp
    from jax._src.interpreters import ad, batching, mlir

    def snapshot():
        tables = dict(batching=batching.fancy_primitive_batchers,
                      jvp=ad.primitive_jvps, transpose=ad.primitive_transposes,
                      lowering=mlir._lowerings)
        return {name: {p: rule for p, rule in t.items()
                       if not str(getattr(p, "name", p)).startswith("genvi")}
                for name, t in tables.items() if isinstance(t, dict)}

    def same(a, b):
        for name in a:
            for p, rule in a[name].items():
                assert b[name].get(p) is rule, (name, p)
            # primitives of JAX modules imported later (checkify's, say) bring their
            # own rules; none of them may be genvi's
            for p in set(b[name]) - set(a[name]):
                module = getattr(b[name][p], "__module__", "") or ""
                assert not module.startswith("genvi"), (name, p, module)

    before = snapshot()
    import genvi as gv
    after_import = snapshot()
    same(before, after_import)

    @gv.gen
    def point(p, y):
        b = gv.flip(p) @ "b"
        m = jax.lax.cond(b, lambda: gv.normal(1.0, 1.0) @ "x", lambda: jnp.float32(-1.0))
        gv.observe(gv.normal(m, 1.0), y)

    @gv.gen
    def model(p, ys):
        gv.plate(point, size=8, in_axes=(None, 0))(p, ys) @ "data"

    @gv.expectation
    def objective(t):
        def one(u):
            c = gv.sample(gv.flip(jax.nn.sigmoid(u), grad=gv.REINFORCE))
            return jax.lax.cond(c, lambda: 1.0 + gv.sample(gv.normal(u, 1.0, grad=gv.REPARAM)),
                                lambda: jnp.float32(-0.5))
        return jnp.sum(jax.vmap(one)(jnp.array([t, 0.5 * t])) ** 2)

    ys = jnp.arange(4.0)
    tr = model.simulate(jax.random.key(0), 0.3, ys)
    model.log_density(tr.choices, 0.3, ys)
    jax.jit(lambda k: objective.value_and_grad_estimate(k, 0.2))(jax.random.key(1))
    same(before, snapshot())

    # a user's own vmap of a cond, outside genvi, runs JAX's rule (select of both branches)
    jaxpr = jax.make_jaxpr(jax.vmap(lambda i, x: jax.lax.cond(i > 0, jnp.sin, jnp.cos, x)))(
        jnp.arange(3), jnp.ones(3))
    assert "select_n" in str(jaxpr), jaxpr
    print("untouched")
""")


def test_jax_rule_tables_are_untouched_by_import_and_runs():
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "untouched" in out.stdout


THREAD_SCRIPT = textwrap.dedent("""
    import threading
    import jax, jax.numpy as jnp
    from jax._src.interpreters import batching
    import genvi as gv

    jax_rule = batching.fancy_primitive_batchers[jax.lax.cond_p]
    inside, resume = threading.Event(), threading.Event()

    @gv.expectation
    def objective(t):
        def one(u):
            c = gv.sample(gv.flip(jax.nn.sigmoid(u), grad=gv.REINFORCE))
            return jax.lax.cond(c, lambda: 1.0 + gv.sample(gv.normal(u, 1.0, grad=gv.REPARAM)),
                                lambda: jnp.float32(-0.5))
        out = jnp.sum(jax.vmap(one)(jnp.array([t, 0.5 * t])) ** 2)
        inside.set()        # genvi is tracing this objective: its cond rule is in force
        resume.wait(60)
        return out

    genvi_trace = threading.Thread(target=lambda: jax.make_jaxpr(
        lambda k: objective.value_and_grad_estimate(k, 0.2))(jax.random.key(1)))
    genvi_trace.start()
    assert inside.wait(120), "the genvi trace did not start"
    assert batching.fancy_primitive_batchers[jax.lax.cond_p] is not jax_rule  # in force

    # meanwhile, another thread's vmap of a plain cond: JAX's rule, JAX's values
    plain = jax.vmap(lambda i, x: jax.lax.cond(i > 0, jnp.sin, jnp.cos, x))
    seen = {}
    def other_thread():
        seen["jaxpr"] = str(jax.make_jaxpr(plain)(jnp.arange(-1, 2), jnp.ones(3)))
        seen["values"] = plain(jnp.arange(-1, 2), jnp.ones(3))
    t = threading.Thread(target=other_thread)
    t.start(); t.join(120)
    resume.set(); genvi_trace.join(120)
    assert batching.fancy_primitive_batchers[jax.lax.cond_p] is jax_rule  # put back

    expected = jnp.where(jnp.arange(-1, 2) > 0, jnp.sin(1.0), jnp.cos(1.0))
    assert "select_n" in seen["jaxpr"] and "genvi" not in seen["jaxpr"], seen["jaxpr"]
    assert jnp.allclose(seen["values"], expected), seen["values"]
    print("another thread untouched")
""")


def test_another_threads_vmap_of_a_plain_cond_runs_jaxs_rule_during_a_genvi_trace():
    # JAX looks up a primitive's batching rule in one process-wide table when the cond
    # is bound, so genvi's rule is in that table while genvi traces (see
    # genvi.core.jaxpr.batching); a cond holding no genvi site, bound outside a genvi
    # trace (on another thread here), still goes to JAX's rule, unchanged
    out = subprocess.run([sys.executable, "-c", THREAD_SCRIPT], capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "another thread untouched" in out.stdout
