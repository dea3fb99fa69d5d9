"""`gv.AUTO` in one place: the marker and its candidates (`choices`), the measurement
that chooses among them (`tune`, `gv.tune`), a fit's tuning while it trains
(`fit_tuning`), and the helper processes that compile the measuring programs
(`compile_aside`, `compile_helper`).

`gv.AUTO` is a placeholder strategy (`Strategy.placeholder`): core resolves it where
a site is bound, from the run context's `site_strategies` (a tuning's choices), and
an objective left with placeholder sites asks the marker for their defaults
(`genvi.adev.placeholders`). Nothing below this package names it.

Example:
    >>> import genvi as gv
    >>> from genvi.auto.choices import AUTO, candidates
    >>> gv.AUTO is AUTO, candidates(gv.flip)
    (True, (gv.ENUM, gv.RLOO(2), gv.MVD, gv.DisARM, gv.SD))
"""
