"""Choice maps: the random choices of one program execution, keyed by address.

A `ChoiceMap` is an immutable JAX pytree over a flat mapping from address paths
(tuples of strings) to arrays. Nested addresses come from sub-program calls:
`cm["layer"]["x"]`, `cm["layer", "x"]` and `cm["layer/x"]` all read the choice at
path `("layer", "x")`. The string "layer/x" is the form genvi prints (summaries such
as `auto.median`, error messages), so it is accepted wherever a choice map takes an
address, including the keys of `gv.choices({"layer/x": 1.0})`.

Example:
    >>> import genvi as gv
    >>> cm = gv.choices({"data": {"y": 1.0}})
    >>> float(cm["data/y"]), cm.paths()
    (1.0, [('data', 'y')])
"""

from __future__ import annotations

from typing import Any, Iterator, Mapping

import jax

from genvi.core.address import Address

Path = tuple


def _as_path(key: Any) -> Path:
    """An address as a path: a tuple as is; "outer/inner" as ("outer", "inner")."""
    return key if isinstance(key, tuple) else Address.parse(key)


def _show(path: Path) -> str:
    return str(Address(path))


@jax.tree_util.register_pytree_node_class
class ChoiceMap:
    """An immutable map from address paths to values; a JAX pytree. A nested address
    is read as a tuple, by successive indexing, or as the string "outer/inner".

    Example:
        >>> import genvi as gv
        >>> cm = gv.choices({"x": 1.0, "layer": {"z": 2.0}})
        >>> float(cm["layer", "z"]), float(cm["layer"]["z"]), float(cm["layer/z"])
        (2.0, 2.0, 2.0)
        >>> sorted((cm | gv.choices({"y": 3.0})).paths())
        [('layer', 'z'), ('x',), ('y',)]
    """

    __slots__ = ("_flat",)

    def __init__(self, flat: Mapping[Path, Any] | None = None):
        self._flat = dict(flat or {})

    # pytree protocol: addresses are static structure, values are leaves.
    def tree_flatten(self):
        paths = sorted(self._flat, key=repr)
        return [self._flat[p] for p in paths], tuple(paths)

    @classmethod
    def tree_unflatten(cls, paths, values):
        return cls(dict(zip(paths, values)))

    def paths(self) -> list[Path]:
        """All full address paths, e.g. `[("x",), ("layer", "z")]`."""
        return list(self._flat)

    def flat(self) -> dict[Path, Any]:
        """A copy of the flat `{path: value}` mapping."""
        return dict(self._flat)

    def __getitem__(self, key: Any) -> Any:
        path = _as_path(key)
        if path in self._flat:
            return self._flat[path]
        n = len(path)
        sub = {p[n:]: v for p, v in self._flat.items() if p[:n] == path and len(p) > n}
        if not sub:
            raise KeyError(f"no choice at address {_show(path)!r} (path {path!r}); "
                           f"addresses present: {sorted(_show(p) for p in self._flat)}. A "
                           "nested address is written \"outer/inner\" or "
                           "(\"outer\", \"inner\").")
        return ChoiceMap(sub)

    def get(self, key: Any, default: Any = None) -> Any:
        try:
            return self[key]
        except KeyError:
            return default

    def __contains__(self, key: Any) -> bool:
        path = _as_path(key)
        return any(p[:len(path)] == path for p in self._flat)

    def __or__(self, other: "ChoiceMap") -> "ChoiceMap":
        other = other if isinstance(other, ChoiceMap) else choices(other)
        return ChoiceMap({**self._flat, **other._flat})

    def __iter__(self) -> Iterator:
        seen = []
        for p in self._flat:
            if p[0] not in seen:
                seen.append(p[0])
        return iter(seen)

    def __len__(self) -> int:
        return len(self._flat)

    def to_dict(self) -> dict:
        """The nested-dict form, inverse of `gv.choices`."""
        out: dict = {}
        for path, v in self._flat.items():
            d = out
            for k in path[:-1]:
                d = d.setdefault(k, {})
            d[path[-1]] = v
        return out

    def prefixed(self, prefix: Path) -> "ChoiceMap":
        """The same choices under an address prefix."""
        return ChoiceMap({tuple(prefix) + p: v for p, v in self._flat.items()})

    def __repr__(self) -> str:
        items = ", ".join(f"{_show(p)}: {getattr(v, 'shape', ())}"
                          for p, v in self._flat.items())
        return f"ChoiceMap({{{items}}})"


def choices(nested: Mapping | ChoiceMap | None = None) -> ChoiceMap:
    """Build a choice map from a nested dict (or copy one). A key "a/b" is the
    nested address ("a", "b"), as genvi prints it, so a summary such as
    `gv.choices(auto.median(params))` addresses the model's nested sites.

    Args:
        nested: a nested dict (keys may be "a/b" addresses) or a choice map to copy;
            empty when omitted.

    Returns:
        a `ChoiceMap`.

    Example:
        >>> import genvi as gv
        >>> gv.choices({"a": {"b": 1.0}})["a", "b"]
        1.0
        >>> gv.choices({"a/b": 1.0}).paths()
        [('a', 'b')]
    """
    if nested is None:
        return ChoiceMap()
    if isinstance(nested, ChoiceMap):
        return ChoiceMap(nested.flat())
    flat: dict = {}

    def walk(prefix: Path, d: Any) -> None:
        if isinstance(d, Mapping):
            for k, v in d.items():
                walk(prefix + _as_path(k), v)
        elif isinstance(d, ChoiceMap):
            for p, v in d.flat().items():
                flat[prefix + p] = v
        else:
            flat[prefix] = d

    walk((), nested)
    return ChoiceMap(flat)
