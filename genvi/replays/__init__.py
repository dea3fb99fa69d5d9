"""The replay engine: the rest of an objective at other values of a site, lane by lane.

Its door is `genvi.replays.engine`: `replay_values(replay, where, x, alternatives)`,
answering `Exact(values, ...)` or `Fallback(reason)`, and the lane values and rules
(`Local`, `Perturbed`, `rule_for`) that `gv.enumeration` builds on; the ADEV interpreter and
`genvi.inference` use nothing else of it. The rooms behind the door: `values` (the
lane-tracked values), `lane_rules` (a rule per structure of primitive, `genvi.core.rules`), `lanes`
(the lane-tracked evaluator, a walk on `genvi.core.walk`), `lane_scan` and
`markov_scan` (scans on lane-tracked values; every step's replays at once), and
`replay` (what a replay is: the run's key, inputs and overrides). It depends only on
`genvi.core`.
"""
