"""`gv.AUTO` in one place: the marker and its candidates (`choices`), the measurement
that chooses among them (`tune`, `gv.tune`), a fit's tuning while it trains
(`fit_tuning`), and the helper processes that compile the measuring programs
(`compile_aside`, `compile_helper`).

`gv.AUTO` is a placeholder strategy (`Strategy.placeholder`): an objective is traced
with it, and where a run begins its estimator rewrites the trace to a tuning's choices
(the run context's `site_strategies`); sites left with the placeholder take the
marker's defaults (`genvi.adev.placeholders`). Nothing below this package names it.

Example:
    >>> import genvi as gv
    >>> from genvi.auto.choices import AUTO, candidates
    >>> gv.AUTO is AUTO, candidates(gv.flip)
    (True, (gv.ENUM, gv.RLOO(2), gv.MVD, gv.DisARM, gv.SD))
"""
