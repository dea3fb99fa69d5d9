"""One process of a `gv.fit(shard=True)` run under `jax.distributed` (or alone), for
tests/test_distributed.py: `python tests/distributed_worker.py PID NPROC PORT SPECS OUT`.

SPECS is JSON: a list of fits ({"steps", "batch_size", "checkpoint_dir", "resume",
"checkpoint_every", "announce"}); OUT receives each fit's parameters, steps and
`stopped` (JSON). With "announce", each process prints "training" once its fit steps."""

import json
import sys


def main(pid: int, nproc: int, port: int, specs: list, out: str) -> None:
    import jax
    if nproc > 1:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(f"localhost:{port}", num_processes=nproc, process_id=pid)

    import jax.numpy as jnp
    import numpy as np
    import optax

    import genvi as gv

    N = 64
    rng = np.random.default_rng(0)
    x = rng.normal(size=(N, 2)).astype(np.float32)
    y = (x @ np.array([1.0, -0.5]) + 0.3 * rng.normal(size=N)).astype(np.float32)
    mine = slice(pid * N // nproc, (pid + 1) * N // nproc)   # this process's rows

    @gv.gen
    def point(w, x, y):
        gv.observe(gv.normal(x @ w, 0.3), y)

    @gv.gen
    def model(params, x, y):
        w = gv.normal(jnp.zeros(2), 1.0) @ "w"
        gv.plate(point, size=N, in_axes=(None, 0, 0))(w, x, y) @ "data"

    @gv.gen
    def guide(params, x, y):
        gv.normal(params["loc"], jnp.exp(params["log_scale"]), grad=gv.REPARAM) @ "w"

    @gv.expectation
    def per_point(params, x, y):   # one datapoint's ELBO term, its weight's share of the prior
        w = gv.sample(gv.normal(params["loc"], jnp.exp(params["log_scale"]), grad=gv.REPARAM))
        log_q = jax.scipy.stats.norm.logpdf(w, params["loc"], jnp.exp(params["log_scale"])).sum()
        log_prior = jax.scipy.stats.norm.logpdf(w, 0.0, 1.0).sum()
        return jax.scipy.stats.norm.logpdf(y, x @ w, 0.3) + (log_prior - log_q) / N

    objectives = {"plate": gv.elbo(model, guide), "batch_mean": gv.batch_mean(per_point, (None, 0, 0))}
    def checkpoints_of(spec):
        if spec.get("checkpoint_dir") is None:
            return None
        return gv.Checkpoints(spec["checkpoint_dir"], every=spec.get("checkpoint_every"),
                              resume=spec.get("resume"))

    def announce(step, params, history, said=[]):
        if not said:
            print("training", flush=True)
            said.append(step)

    results = []
    for spec in specs:
        result = gv.fit(objectives[spec.get("objective", "plate")], {"loc": jnp.zeros(2), "log_scale": jnp.full(2, -1.0)},
                        x[mine], y[mine], optimizer=optax.adam(0.05), steps=spec["steps"],
                        key=jax.random.key(0), batch_size=spec.get("batch_size"), shard=True,
                        progress=False, checkpoints=checkpoints_of(spec),
                        callbacks=[announce] if spec.get("announce") else [])
        results.append({k: np.asarray(v).tolist() for k, v in result.params.items()}
                       | {"steps_done": len(result.history["objective"]),
                          "stopped": result.stopped})
    with open(out, "w") as f:
        json.dump(results, f)


if __name__ == "__main__":   # not at import: pytest imports this module for doctests
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), json.loads(sys.argv[4]),
         sys.argv[5])
