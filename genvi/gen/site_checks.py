"""Validation's per-site checks: parameters, observed values and values read from a
choice map, emitted by the interpreters as host callbacks under `gv.validation()`.

The switch and the error plumbing live in `genvi.core.validation`; this module holds
what is checked at a site and how a check reaches the host once per execution (also
under `vmap`, `scan` and the lanes of a batched `cond`, where an untaken branch's
parameters may well be invalid).

Example:
    >>> import genvi as gv
    >>> @gv.gen
    ... def g(p):
    ...     gv.flip(p) @ "b"
    >>> try:
    ...     with gv.validation():
    ...         g.log_density(gv.choices({"b": 2}), 0.3)      # 2 is not a coin outcome
    ... except gv.InvalidParameters as e:
    ...     print(str(e).split(":")[0])
    invalid value for gv.flip at address 'b' in program 'g'
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.custom_batching import custom_vmap

from genvi.core import jaxpr as jx
from genvi.core.primitives import SiteEqn
from genvi.core.scopes import density_scope
from genvi.core.validation import InvalidParameters, enabled, raise_invalid, within

_FIX_PARAMS = ("Fix the values computed for this site (e.g. pass a scale through jnp.exp "
               "or jax.nn.softplus, a probability through jax.nn.sigmoid).")
_FIX_VALUE = ("Check the data passed as this observation (NaNs, missing values, units, "
              "the encoding of categories and counts).")
_FIX_READ = "Fix the value at this address in the choice map."


def branch_gate(gate: Any, index: Any, branch: int) -> Any:
    """The lanes where branch `branch` of a cond with index `index` runs, inside a body
    that runs where `gate` holds (None: everywhere): checks there hold only in those
    lanes. `jax.vmap` of a `cond` runs every branch in every lane (a select), where an
    untaken branch's parameters may well be invalid. The interpreter passes each
    body's gate down explicitly.

    Example:
        >>> import jax.numpy as jnp, genvi as gv
        >>> with gv.validation():
        ...     branch_gate(None, jnp.array([0, 1]), 1).tolist()
        [False, True]
        >>> branch_gate(None, jnp.array([0, 1]), 1) is None    # validation off: no checks
        True
    """
    if not enabled():
        return None
    here = jnp.asarray(index) == branch
    return here if gate is None else gate & here


def check_site(eqn: Any, ins: list, offset: int = 0, value: bool = True,
               gate: Any = None) -> None:
    """Emit the run-time check of a site's parameters (`offset=1`: an observation,
    whose observed value `ins[0]` is checked too unless `value` is False: the sleep
    phase ignores it). `gate`: the lanes where the body holding `eqn` runs (see
    `branch_gate`; None: everywhere). A no-op when validation is off.

    Example:
        >>> from genvi.gen.site_checks import check_site   # called by the interpreters
    """
    site = SiteEqn.of(eqn)
    if not enabled() or site.masked:
        # masked sites (untaken lanes of a batched cond) may hold any parameters
        return
    dist = site.dist
    params = tuple(ins[offset:offset + site.n_params])
    observed = offset == 1
    line = jx.source_line(eqn) if observed else None
    where = f"the observation {line}" if observed else _address(eqn)
    program = within()
    with density_scope():
        checks = [(ok, m, None) for ok, m in dist.check_params(*params)]
        head = f"invalid parameters for {dist.label} at {where}{program}"
        _emit(checks, gate, lambda bad: f"{head}: {'; '.join(bad)}. {_FIX_PARAMS}")
        if observed and value:
            _check_value(dist, ins[0], params, gate, f"invalid observation for {dist.label} "
                         f"at {line}{program}", _FIX_VALUE)


def check_read_value(eqn: Any, ins: list, value: Any, gate: Any = None) -> None:
    """Emit the run-time check of a value read from a choice map at a site (scored by
    `log_density`): inside the distribution's support.

    Example:
        >>> from genvi.gen.site_checks import check_read_value   # called by the interpreters
    """
    site = SiteEqn.of(eqn)
    if not enabled() or site.masked:
        return
    dist = site.dist
    program = within()
    with density_scope():
        _check_value(dist, value, tuple(ins[:site.n_params]), gate,
                     f"invalid value for {dist.label} at {_address(eqn)}{program}", _FIX_READ)


def _address(eqn: Any) -> str:
    addr = SiteEqn.of(eqn).addr
    assert addr is not None  # a program's site (not an observation) has an address
    return f"address {'/'.join(map(str, addr))!r}"

def _check_value(dist: Any, value: Any, params: tuple, gate: Any, head: str, fix: str) -> None:
    value = jax.lax.stop_gradient(jnp.asarray(value))
    params = tuple(jax.lax.stop_gradient(q) for q in params)
    checks = [(ok, f"the value {m}", value) for ok, m in dist.check_value(value, *params)]
    _emit(checks, gate, lambda bad: f"{head}: {'; '.join(bad)}. {fix}")


def _emit(checks: list, gate: Any, message: Callable[[list], str]) -> None:
    """One host callback for a list of `(condition, meaning, value or None)`; the
    callback raises `InvalidParameters(message(failed meanings))`. Each condition is
    reduced on the device to (holds, number of failing entries, a failing value);
    where `gate` (a boolean, None: everywhere) is False, the site does not run."""
    if not checks:
        return
    if gate is not None:
        checks = [(jnp.asarray(ok) | ~gate, m, value) for ok, m, value in checks]
    parts = [_summary(ok, value) for ok, _, value in checks]
    oks, counts, examples = (jnp.stack(col) for col in zip(*parts))
    meanings = [m for _, m, _ in checks]
    counted = [value is not None for _, _, value in checks]

    def report(oks, counts, examples):
        oks, counts, examples = np.asarray(oks), np.asarray(counts), np.asarray(examples)
        if oks.all():
            return
        bad = []
        for i in np.flatnonzero(~oks):
            if not counted[i]:
                bad.append(meanings[i])
            elif counts[i] > 1:
                bad.append(f"{meanings[i]} ({counts[i]} entries fail, e.g. {examples[i]:g})")
            else:
                bad.append(f"{meanings[i]} (got {examples[i]:g})")
        raise_invalid(InvalidParameters(message(bad)))

    _callback(report)(oks, counts, examples)


def _summary(ok: Any, value: Any) -> tuple:
    ok = jnp.asarray(ok, bool)
    bad = jnp.ravel(~ok)
    example = jnp.zeros((), jnp.float32)
    if value is not None and jnp.shape(value) == ok.shape and ok.size:
        example = jnp.ravel(value)[jnp.argmax(bad)].astype(jnp.float32)
    return ~jnp.any(bad), jnp.sum(bad, dtype=jnp.int32), example


def _callback(report: Callable) -> Callable:
    """`report(oks, counts, examples)` as a debug callback that runs once per
    execution under `vmap` too (JAX would unroll one callback per lane): the batch is
    reduced first, keeping the first failing lane's example."""
    @custom_vmap
    def check(oks, counts, examples):
        jax.debug.callback(report, oks, counts, examples)
        return oks

    @check.def_vmap
    def batched(size, in_batched, oks, counts, examples):
        oks, counts, examples = (x if b else jnp.broadcast_to(x, (size,) + x.shape)
                                 for x, b in zip((oks, counts, examples), in_batched))
        first = jnp.argmax(~oks, axis=0)
        example = jnp.take_along_axis(examples, first[None], axis=0)[0]
        return check(oks.all(0), counts.sum(0), example), False

    return check
