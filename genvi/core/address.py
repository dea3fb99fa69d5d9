"""`Address`: a site's address, its path of names outermost first, and the one place
addresses are written as text ("outer/inner") and read back from it.

An `Address` is a tuple (it compares, hashes and indexes as the plain tuple of its
names), so sites, choice maps and strategies keep their tuples; `str` joins it with
"/", `shown` does so with a word for the empty address of an unnamed draw, and
`Address.parse` reads an address a user wrote, as a string or a tuple.

Example:
    >>> a = Address.parse("enc/z")
    >>> a, str(a), a == ("enc", "z"), Address(()).shown()
    (('enc', 'z'), 'enc/z', True, '(gv.sample)')
"""

from __future__ import annotations

from typing import Any


class Address(tuple):
    """A site's address (see the module docstring)."""

    __slots__ = ()

    @classmethod
    def parse(cls, key: Any) -> "Address":
        """An address as a user writes it: a tuple of names as it is, "outer/inner" as
        ("outer", "inner"), any other name as a path of one.

        Args:
            key: a tuple, a "/"-separated string, or one name.

        Returns:
            The `Address`.
        """
        if isinstance(key, tuple):
            return cls(key)
        if isinstance(key, str) and "/" in key:
            return cls(key.split("/"))
        return cls((key,))

    def __str__(self) -> str:
        return "/".join(map(str, self))

    def shown(self, unnamed: str = "(gv.sample)") -> str:
        """The address as text, or `unnamed` for the empty address of an unnamed draw.

        Args:
            unnamed: what to show for the empty address.

        Returns:
            "outer/inner", or `unnamed`.
        """
        return str(self) if self else unnamed
