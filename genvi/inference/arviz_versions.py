"""The two ArviZ calls genvi makes, for whichever ArviZ is installed: 1.x or 0.x.

genvi needs ArviZ for two things: building a container of draws (`gv.to_arviz`) and
Pareto-smoothed importance sampling (`gv.diagnose`). ArviZ 1.x moved them into
arviz-base (`from_dict`, which returns an `xarray.DataTree`) and arviz-stats
(`psislw`, which takes log *likelihoods*, the negated log weights, as LOO uses
them); ArviZ 0.x has `arviz.from_dict` (an `InferenceData`) and `arviz.psislw` (log
weights). `require_arviz` returns an `ArviZ` record of both calls with one meaning,
so no other module reads ArviZ's version. ArviZ is optional (`pip install
'genvi[arviz]'`) and imported only when called.

Example:
    >>> import numpy as np
    >>> from genvi.inference.arviz_versions import require_arviz
    >>> az = require_arviz("gv.diagnose")
    >>> smoothed, khat = az.psislw(np.linspace(-1.0, 0.0, 1000))
    >>> bool(khat < 0.5), round(float(np.exp(smoothed).sum()), 6)
    (True, 1.0)
"""

from __future__ import annotations

import sys
import warnings
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np


@dataclass(frozen=True)
class ArviZ:
    """The installed ArviZ, seen through the two calls genvi makes.

    `version`: ArviZ's version string. `from_groups(groups, dims, coords)`: a
    container of `{group: {variable: array}}` (draws with their chain and draw axes
    first), an `xarray.DataTree` on ArviZ 1.x and an `InferenceData` on 0.x; both
    answer `az.summary`, `container.posterior["mu"]` and `to_netcdf`.
    `psislw(log_weights)`: (Pareto-smoothed log weights normalized to sum to one
    in probability, the Pareto shape k̂) of a 1-D array of log importance weights.

    Example:
        >>> from genvi.inference.arviz_versions import require_arviz
        >>> az = require_arviz("gv.to_arviz")
        >>> import numpy as np
        >>> data = az.from_groups({"posterior": {"mu": np.zeros((1, 10))}}, None, None)
        >>> data.posterior["mu"].shape
        (1, 10)
    """

    version: str
    from_groups: Callable[[dict, dict | None, dict | None], Any]
    psislw: Callable[[np.ndarray], tuple[np.ndarray, float]]

    @property
    def major(self) -> int:
        """ArviZ's major version: 0 or 1."""
        return int(self.version.split(".")[0])


def _arviz_1(arviz: Any) -> ArviZ:
    import arviz_base  # noqa: PLC0415 - optional dependency, installed with arviz 1.x
    from arviz_stats.base import array_stats  # noqa: PLC0415 - likewise

    def psislw(log_weights: np.ndarray) -> tuple[np.ndarray, float]:
        # arviz-stats smooths the weights of log *likelihoods* (LOO's ratios 1 / p(y_i | θ))
        smoothed, khat = array_stats.psislw(-np.asarray(log_weights), r_eff=1)
        return np.asarray(smoothed), float(khat)

    return ArviZ(arviz.__version__,
                 lambda groups, dims, coords: arviz_base.from_dict(groups, dims=dims,
                                                                   coords=coords),
                 psislw)


def _arviz_0(arviz: Any) -> ArviZ:
    def psislw(log_weights: np.ndarray) -> tuple[np.ndarray, float]:
        smoothed, khat = arviz.psislw(np.asarray(log_weights))
        return np.asarray(smoothed), float(khat)

    return ArviZ(arviz.__version__,
                 lambda groups, dims, coords: arviz.from_dict(**groups, dims=dims,
                                                              coords=coords),
                 psislw)


def require_arviz(what: str) -> ArviZ:
    """The installed ArviZ (0.x or 1.x) as an `ArviZ` record, or an `ImportError`
    saying how to install it; `what` names the genvi function that needs it.

    Example:
        >>> from genvi.inference.arviz_versions import require_arviz
        >>> require_arviz("gv.to_arviz").major in (0, 1)
        True
    """
    stand_in_before = sys.modules.get("numpyro")
    try:
        with warnings.catch_warnings():  # ArviZ 0.x announces 1.0 once a day
            warnings.simplefilter("ignore", FutureWarning)
            import arviz  # noqa: PLC0415 - optional dependency
    except ImportError as err:
        raise ImportError(
            f"{what} needs ArviZ, an optional dependency of genvi: install it with "
            "pip install 'genvi[arviz]' (or pip install arviz)") from err
    _load_lazy_numpyro(stand_in_before)
    major = int(arviz.__version__.split(".")[0])
    if major >= 2:
        raise ImportError(f"{what} supports ArviZ 0.23 to 1.x; ArviZ {arviz.__version__} is "
                          "installed: pip install 'arviz<2'")
    return _arviz_1(arviz) if major == 1 else _arviz_0(arviz)


def _load_lazy_numpyro(before: Any) -> None:
    """ArviZ 1.x (arviz-base) leaves a lazy stand-in for NumPyro in `sys.modules` when
    it is imported. A later `import numpyro.distributions` (the submodule first, as
    NumPyro users write it) then builds the package half-way, and NumPyro fails inside
    with "module 'numpyro.distributions' has no attribute 'distribution'". A stand-in
    that importing ArviZ put there is loaded at once, so the user's own imports work."""
    module = sys.modules.get("numpyro")
    if module is not None and module is not before and \
            type(module).__name__ == "_LazyModule":
        getattr(module, "__version__", None)  # any attribute loads a lazy module
