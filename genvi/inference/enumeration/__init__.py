"""Enumeration: discrete sites summed out of a model exactly, one pipeline.

`gv.marginal(model, keep=[...], algorithm=gv.enumeration())` runs four stages, each a
module, the data flowing one way:

1. `sites`: which sites are summed, and their finite supports;
2. `evaluate` (with `same`: every lane at one value) and `factors`: the log density,
   traced once with the sites' values as inputs, read as factors over sites and plates;
3. `contract` (variable elimination over sites and plates) and, for a `gv.scan`,
   `chain` with `time` (the steps as a time dimension, multiplied in order or in a tree);
4. `marginal`: the pipeline, and the plan it reports to `explain`.

Example:
    >>> import genvi as gv
    >>> gv.enumeration(time="parallel")
    Enumeration(time='parallel')
"""

from genvi.inference.enumeration.marginal import EnumeratedMarginal, Enumeration, enumeration

__all__ = ["EnumeratedMarginal", "Enumeration", "enumeration"]
