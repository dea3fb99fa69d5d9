"""Training AIR with any estimator under a wall-clock budget, evaluating count
accuracy and the held-out ELBO along the way.

Steps run in jitted chunks (`lax.scan` over `chunk` steps, minibatches drawn on
device); evaluation happens between chunks and is not counted in the training time.
The baseline network (when the estimator has one) trains at its own learning rate.

Example:
    >>> from genvi_experiments.air.config import AIRConfig
    >>> from genvi_experiments.air.data import make_canvases
    >>> from genvi_experiments.air.train import train_air
    >>> cfg = AIRConfig(rnn_hidden=16, predict_hidden=8, encoder_hidden=8,
    ...                 decoder_hidden=8, z_what=4, window=6)
    >>> run = train_air(cfg, make_canvases(train=32, test=16), "mvd", steps=4, chunk=2,
    ...                 batch_size=8, eval_size=16)
    >>> [row["step"] for row in run["log"]]
    [0, 2, 4]
"""

from __future__ import annotations

import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

import genvi as gv
from genvi_experiments.air.config import AIRConfig
from genvi_experiments.air.data import Canvases
from genvi_experiments.air.estimators import ESTIMATORS, air_objective, count_objects
from genvi_experiments.air.model import AIRNets


def air_optimizer(cfg: AIRConfig, lr: float | None = None) -> optax.GradientTransformation:
    """Adam at `lr` (default `cfg.lr`) and at `cfg.baseline_lr` for the baseline net."""
    def labels(params):
        return {k: jax.tree_util.tree_map(lambda _: "baseline" if k == "baseline" else "main", v)
                for k, v in params.items()}
    return optax.multi_transform({"main": optax.adam(cfg.lr if lr is None else lr),
                                  "baseline": optax.adam(cfg.baseline_lr)}, labels)


def make_step(objective, optimizer: optax.GradientTransformation, train: jax.Array,
              batch_size: int):
    """One training step `((params, opt_state), key) -> ((params, opt_state), value)`:
    a random minibatch of `train`, the objective's gradient estimate, an update."""
    def one_step(carry, key):
        params, opt_state = carry
        k_batch, k_est = jax.random.split(key)
        batch = train[jax.random.randint(k_batch, (batch_size,), 0, train.shape[0])]
        value, grads = objective.value_and_grad_estimate(k_est, params, batch)
        updates, opt_state = optimizer.update(jax.tree_util.tree_map(jnp.negative, grads),
                                              opt_state, params)
        return (optax.apply_updates(params, updates), opt_state), value
    return one_step


def train_air(cfg: AIRConfig, data: Canvases, estimator: str, steps: int | None = None,
              minutes: float | None = None, batch_size: int = 64, lr: float | None = None,
              chunk: int = 200, eval_size: int = 1000, seed: int = 0,
              verbose: bool = False) -> dict[str, Any]:
    """Train until `steps` or `minutes` of training (whichever comes first).

    Returns `{"params", "log", "compile_seconds", "step_ms", "model", "guide"}`;
    `log` rows hold step, training seconds, held-out count accuracy and ELBO (per
    image)."""
    if steps is None and minutes is None:
        raise ValueError("give steps=, minutes= or both")
    nets = AIRNets(cfg)
    objective, model, guide = air_objective(cfg, nets, estimator)
    key_init, key_train, key_eval = jax.random.split(jax.random.key(seed), 3)
    params = nets.init(key_init, baseline=ESTIMATORS[estimator].baseline)
    optimizer = air_optimizer(cfg, lr)
    opt_state = optimizer.init(params)
    train = jnp.asarray(data.train)
    test = jnp.asarray(data.test[:eval_size])
    test_counts = np.asarray(data.test_counts[:eval_size])
    elbo = gv.batch_mean(gv.elbo(model, guide))  # the held-out ELBO, per image

    one_step = make_step(objective, optimizer, train, batch_size)

    @jax.jit
    def run_chunk(params, opt_state, key):
        (params, opt_state), values = jax.lax.scan(one_step, (params, opt_state),
                                                   jax.random.split(key, chunk))
        return params, opt_state, values

    @jax.jit
    def evaluate(params, key):
        k_count, k_elbo = jax.random.split(key)
        counts = count_objects(guide, params, test, k_count)
        return counts, elbo.estimate(k_elbo, params, test)

    log, trained, done, compile_seconds = [], 0.0, 0, None
    budget = None if minutes is None else 60.0 * minutes

    def record():
        counts, value = evaluate(params, jax.random.fold_in(key_eval, done))
        acc = float(np.mean(np.asarray(counts) == test_counts))
        log.append({"step": done, "seconds": trained, "accuracy": acc, "elbo": float(value)})
        if verbose:
            print(f"  {estimator}: step {done:6d}  {trained:7.1f} s  count accuracy {acc:.3f}  "
                  f"held-out ELBO {float(value):9.2f}", flush=True)

    record()
    while (steps is None or done < steps) and (budget is None or trained < budget):
        key = jax.random.fold_in(key_train, done)
        if compile_seconds is None:  # compiled ahead of time, so not counted as training
            t0 = time.perf_counter()
            compiled = run_chunk.lower(params, opt_state, key).compile()
            compile_seconds = time.perf_counter() - t0
        t0 = time.perf_counter()
        params, opt_state, _ = compiled(params, opt_state, key)
        jax.block_until_ready(params)
        trained += time.perf_counter() - t0
        done += chunk
        record()
    per_step = 1e3 * trained / max(done, 1)
    return {"params": params, "log": log, "compile_seconds": compile_seconds,
            "step_ms": per_step, "model": model, "guide": guide}
