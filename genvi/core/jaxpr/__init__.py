"""Everything genvi needs from JAX's internals, in one place: the fence.

genvi represents programs as jaxprs holding its own primitives (sampling sites,
observations) and interprets them. This package is the only code that imports
`jax.extend.core`, `jax.interpreters` or `jax._src`, split by concern:

* `basics`: defining primitives, evaluating and differentiating one equation, where
  an equation came from in the user's source;
* `views`: typed views of the control-flow equations genvi interprets (`ScanEqn`,
  `CondEqn`, `CallEqn`, `WhileEqn`; `view(eqn)` gives one), the only readers of
  their parameters;
* `analyses`: questions about a whole jaxpr (every equation, whether a primitive is
  bound inside);
* `batching`: how `vmap` batches genvi's sites, and `cond`s while genvi traces
  (`genvi_conds`); `trace` runs a function to a jaxpr under that rule.

Callers read it as one namespace (`from genvi.core import jaxpr as jx`). A JAX upgrade
touches this package (and the rule tables keyed by primitive) only;
`tests/test_jaxpr_internals.py` pins its behaviour.

Example:
    >>> import jax
    >>> from genvi.core import jaxpr as jx
    >>> f = lambda c, xs: jax.lax.scan(lambda c, x: (c + x, c), c, xs)
    >>> (eqn,) = jax.make_jaxpr(f)(0.0, jax.numpy.zeros(3)).eqns
    >>> view = jx.view(eqn)
    >>> type(view).__name__, view.length
    ('ScanEqn', 3)
"""

from genvi.core.jaxpr.basics import (GENVI_DIR, JAX_DIR, ClosedJaxpr, Jaxpr, Literal,
                                     emitted_as, eval_eqn, eval_eqn_with, is_drop, is_float,
                                     is_float_aval, jvp_eqn, make_primitive, name_stack,
                                     not_the_users, output_dependence,
                                     quiet_callback_errors, read, source_line)
from genvi.core.jaxpr.views import (CallEqn, CondEqn, CustomEqn, ScanEqn, WhileEqn, call_body,
                                    cond_branches, has_custom_rule, kind, name_of, nesting,
                                    reduced_axes, shaped, sort_keys, view)
from genvi.core.jaxpr.analyses import (CONDS, consumers, contains, equations, live_equations,
                                       map_equations, nests, sub_jaxprs)
from genvi.core.jaxpr.batching import (cond_token, genvi_conds, register_batching_by_broadcasting,
                                       register_fancy_batching, set_cond_batching, trace)

__all__ = [
    "CONDS", "GENVI_DIR", "JAX_DIR", "CallEqn", "ClosedJaxpr", "CondEqn", "Jaxpr", "Literal",
    "CustomEqn", "ScanEqn", "WhileEqn", "call_body", "cond_branches", "cond_token", "consumers", "contains",
    "emitted_as", "equations", "eval_eqn", "eval_eqn_with", "genvi_conds", "has_custom_rule",
    "is_drop",
    "is_float", "is_float_aval", "jvp_eqn", "kind", "live_equations", "make_primitive",
    "map_equations", "name_of",
    "name_stack", "nesting", "nests", "not_the_users", "output_dependence", "quiet_callback_errors", "read", "reduced_axes",
    "register_batching_by_broadcasting", "register_fancy_batching", "set_cond_batching",
    "shaped", "sort_keys", "source_line", "sub_jaxprs", "trace", "view",
]
