"""Lane-tracked `scan`: the rest of an objective through a scan, for lane-local replays
of a batched site inside (or before) it (see `genvi.replays.lanes`).

Each carry keeps one kind of value across steps: lane-free, `Local` along fixed lane
axes, or `Perturbed`. The kinds are found as JAX's scan batching rule finds batched
carries: evaluate the body abstractly, widen each carry's kind to cover what the body
returns, repeat until nothing changes. A lane-free initial carry is then carried as a
`Local` whose alternative equals its base until the site (at its traced step) makes
them differ.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from genvi.replays.replay import split_keys
from genvi.replays.values import Coupled, Local, Perturbed, is_tracked
from genvi.core import jaxpr as jx
from genvi.core.walk import env_of

SAME, PERTURBED = ("same",), ("perturbed",)


def _kind(v: Any) -> tuple:
    if isinstance(v, Local):
        return ("local", v.axes)
    return PERTURBED if isinstance(v, Perturbed) else SAME


def _join(a: tuple, b: tuple) -> tuple:
    if a == b or b == SAME:
        return a
    if a == SAME:
        return b
    return PERTURBED  # different lane axes, or anything with a per-replay value


def _encode(ev: Any, v: Any, kind: tuple) -> Any:
    if kind == SAME:
        if is_tracked(v):
            raise Coupled("scan carry")  # cannot happen once the kinds are a fixed point
        return v
    if kind == PERTURBED:
        return ev.materialize(v).values
    if isinstance(v, Local):
        return (v.base, v.alt)
    return (v, v)


def _decode(enc: Any, kind: tuple) -> Any:
    if kind == SAME:
        return enc
    if kind == PERTURBED:
        return Perturbed(enc)
    return Local(enc[0], enc[1], kind[1])


def _sliced(v: Any) -> tuple[Any, tuple]:
    """A scanned-over operand as arrays with the step axis first, and its per-step kind."""
    if isinstance(v, Local):
        if 0 in v.axes:
            raise Coupled("scan over the lane axis")
        return (v.base, v.alt), ("local", tuple(a - 1 for a in v.axes))
    if isinstance(v, Perturbed):
        return jnp.moveaxis(v.values, 1, 0), PERTURBED
    return v, SAME


def _stacked(enc: Any, kind: tuple) -> Any:
    if kind == SAME:
        return enc
    if kind == PERTURBED:
        return Perturbed(jnp.moveaxis(enc, 0, 1))
    return Local(enc[0], enc[1], tuple(a + 1 for a in kind[1]))


def lane_scan(ev: Any, eqn: Any, ins: list, key: Any, steps: tuple) -> list:
    """Evaluate a `scan` equation holding sampling sites on lane-tracked operands,
    with the same keys and step locations as a replay of the objective."""
    scan = jx.ScanEqn.of(eqn)
    body, length = scan.body, scan.length
    consts, init, xs = scan.split(ins)
    sliced = [_sliced(x) for x in xs]
    x_arrays, x_kinds = [a for a, _ in sliced], [k for _, k in sliced]
    step_keys = None if key is None else jax.random.split(key, length)

    def run_body(carry, x_enc, i, k):
        env = env_of(body, consts + list(carry)
                     + [_decode(e, kd) for e, kd in zip(x_enc, x_kinds)])
        keys = {} if k is None else split_keys(body.jaxpr, k)
        return ev.level(body.jaxpr, 0, env, keys, steps + (eqn, i))

    def first(a):
        return jax.tree.map(lambda leaf: leaf[0], a)

    kinds = [_kind(v) for v in init]
    for _ in range(scan.carry_count + 2):
        found: dict = {}

        def probe(carry_enc, kinds=kinds, found=found):
            outs = run_body([_decode(e, kd) for e, kd in zip(carry_enc, kinds)],
                            first(x_arrays), jnp.zeros((), jnp.int32),
                            None if step_keys is None else step_keys[0])
            new_c, ys = scan.split_outs(outs)
            found["carry"], found["ys"] = [_kind(v) for v in new_c], [_kind(v) for v in ys]

        jax.eval_shape(probe, [_encode(ev, v, kd) for v, kd in zip(init, kinds)])
        widened = [_join(a, b) for a, b in zip(kinds, found["carry"])]
        if widened == kinds:
            break
        kinds = widened
    else:  # pragma: no cover - each pass widens at least one carry, at most twice
        raise Coupled("scan carry")
    y_kinds = found["ys"]

    def step(carry, x):
        c_enc, i = carry
        x_enc, k = x
        outs = run_body([_decode(e, kd) for e, kd in zip(c_enc, kinds)], x_enc, i, k)
        new_c, ys = scan.split_outs(outs)
        new_c = [_encode(ev, v, kd) for v, kd in zip(new_c, kinds)]
        ys = [_encode(ev, v, kd) for v, kd in zip(ys, y_kinds)]
        return (new_c, i + 1), ys

    init_enc = [_encode(ev, v, kd) for v, kd in zip(init, kinds)]
    (c_enc, _), ys = scan.scan(step, (init_enc, jnp.zeros((), jnp.int32)),
                               (x_arrays, step_keys))
    return ([_decode(e, kd) for e, kd in zip(c_enc, kinds)]
            + [_stacked(e, kd) for e, kd in zip(ys, y_kinds)])
