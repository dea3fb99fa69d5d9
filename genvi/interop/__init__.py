"""Programs of other probabilistic languages run as genvi programs.

`gv.from_numpyro(fn)` runs a NumPyro model or guide function unchanged
(`genvi.interop.numpyro_program`, `numpyro_effects`). NumPyro is an optional dependency
(`pip install genvi[numpyro]`), imported on the first call: `import genvi` never loads it.
"""

from __future__ import annotations

from typing import Any, Callable


def from_numpyro(fn: Callable, strategies: Any = None) -> Any:
    """A NumPyro model or guide function as a genvi program, run unchanged (see
    `genvi.interop.numpyro_program.from_numpyro` for the whole contract).

    Args:
        fn: a NumPyro model or guide (a function, or one wrapped in NumPyro handlers).
        strategies: a gradient strategy for every latent site without its own
            `infer={"grad": ...}`, or a dict from NumPyro site name to strategy (whose
            entries override a site's own).

    Returns:
        a genvi program taking `(params, *args)`; `program.init(key, *args)` gives the
        function's own initial parameters.

    Example:
        >>> import genvi as gv, numpyro, numpyro.distributions as nd, jax
        >>> def model():
        ...     numpyro.sample("z", nd.Normal(0.0, 1.0))
        >>> tr = gv.from_numpyro(model).simulate(jax.random.key(0), {})
        >>> tr.choices["z"].shape
        ()
    """
    try:
        # optional dependency: loaded on the first call, not with genvi
        from genvi.interop import numpyro_program  # noqa: PLC0415
    except ModuleNotFoundError as err:
        if err.name is None or not err.name.startswith("numpyro"):
            raise
        raise ModuleNotFoundError(
            "gv.from_numpyro runs NumPyro programs and needs NumPyro, an optional dependency "
            "of genvi: pip install 'genvi[numpyro]'") from err
    return numpyro_program.from_numpyro(fn, strategies)
