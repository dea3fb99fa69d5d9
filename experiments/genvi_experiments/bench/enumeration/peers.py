"""genvi's enumeration beside NumPyro's exact enumeration, one table over five models:
a Gaussian mixture (`--points`, K = 3), a hidden Markov model (K = 3, `--steps-hmm`
steps), a batch of sequences (`--sequences` × `--steps-hmm` steps, `--states`
states), nested plates (`--groups` × `--members`) and a long HMM (`--steps-long`).
The models are those of `mixture_hmm.py` and `plates.py`.

Each side fits the continuous latents with a mean-field normal guide and Adam
(lr 0.05): genvi `gv.marginal(model, keep=..., algorithm=gv.enumeration())` under
`gv.auto_normal`, NumPyro the enumerated model under `AutoNormal`, both starting where
NumPyro's `AutoNormal` starts (`gv.init_to_value`). A call runs a compiled loop of 200
steps (`jax.lax.scan`): genvi's `gv.training_step`; NumPyro's `SVI.update` with
`TraceEnum_ELBO` where that is exact (mixture, nested plates), and on the models with
a scan, where it is not, an ELBO step on the exact `numpyro.contrib.funsor.log_density`
(`mixture_hmm.numpyro_methods`' "NumPyro exact enumeration"). Reports the warm time per
step (interleaved rounds, medians over 200), "× NumPyro" (the median over rounds of
genvi's time over NumPyro's in the same round: below 1 genvi is faster; with
`--repeat N`, the median of N runs' ratios, each run printed) and genvi's log density
minus NumPyro's enumerated `log_density` at NumPyro's starting point (about 0).

    python -m genvi_experiments.bench.enumeration.peers [--models mixture hmm sequences
        nested long] [--rounds 15] [--repeat 1] [--points 1000] [--steps-hmm 100]
        [--steps-long 1000] [--sequences 50] [--states 5] [--groups 100]
        [--members 20] [--record]

`--record` writes the table to docs/benchmarks/enumeration.md through
`genvi_experiments.bench.results`.
"""

from __future__ import annotations

import argparse
import time
from typing import Any, Callable, NamedTuple

import jax
import optax

import genvi as gv
from genvi_experiments.bench.enumeration import mixture_hmm as flat
from genvi_experiments.bench.enumeration import plates
from genvi_experiments.bench.enumeration.plates import LOOP
from genvi_experiments.bench.results import command, record
from genvi_experiments.common.timing import (describe_machine, interleaved_samples, median,
                                             paired_ratio)

LR = 0.05
MODELS = ["mixture", "hmm", "sequences", "nested", "long"]


class Case(NamedTuple):
    label: str               # the model and its size
    form: str                # NumPyro's form of the step
    loops: dict[str, Callable[[], Any]]   # {"genvi" | "NumPyro": LOOP warm steps}
    difference: float        # genvi's log density − NumPyro's, at NumPyro's start


def scanned(step: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """`LOOP` steps of `step` (state -> state) in one compiled loop."""
    return jax.jit(lambda s: jax.lax.scan(lambda s, _: (step(s), None), s, None,
                                          length=LOOP)[0])


def numpyro_side(kind: str, data: jax.Array, states: int, key: jax.Array
                 ) -> tuple[Callable, Any, dict, Callable, int, str]:
    """(one step, its start state, the guide's start {site: value}, the model, its plate
    nesting, the step's form) of NumPyro's exact enumeration of `kind`."""
    from numpyro import handlers
    from numpyro.infer import SVI, TraceEnum_ELBO
    from numpyro.infer.autoguide import AutoNormal

    if kind == "nested":
        model = plates.numpyro_model
        guide = AutoNormal(handlers.block(model, hide=["a", "c"]))
        svi = SVI(model, guide, optax.adam(LR), TraceEnum_ELBO(max_plate_nesting=2))
        first = svi.init(key, data)
        return (lambda st: svi.update(st, data)[0], first,
                guide.median(svi.get_params(first)), model, 2, "TraceEnum_ELBO")
    kind = "hmm" if kind == "long" else kind
    methods, start = flat.numpyro_methods(kind, data, LR, states, key)
    name, form = (("NumPyro TraceEnum_ELBO", "TraceEnum_ELBO") if kind == "mixture"
                  else ("NumPyro exact enumeration", "exact log_density"))
    step, first = methods[name][:2]
    return step, first, start, flat.numpyro_model(kind, states), 1, form


def build(kind: str, a: argparse.Namespace) -> Case:
    """Both sides' compiled loops of `kind`, warmed, and their log densities' difference."""
    from numpyro.contrib.funsor import config_enumerate, enum
    from numpyro.contrib.funsor import log_density as enum_log_density

    key = jax.random.key(0)
    states = a.states if kind == "sequences" else flat.K
    data, model, keep, label = {
        "mixture": (flat.mixture_data(a.points), flat.mixture, ["w", "mu"],
                    f"mixture, {a.points} points"),
        "hmm": (flat.hmm_data(a.steps_hmm), flat.hmm, ["trans", "means"],
                f"HMM, {a.steps_hmm} steps"),
        "long": (flat.hmm_data(a.steps_long), flat.hmm, ["trans", "means"],
                 f"HMM, {a.steps_long} steps"),
        "sequences": (flat.sequences_data(a.sequences, a.steps_hmm, states),
                      flat.sequences_model(states), ["trans", "means"],
                      f"{a.sequences} sequences × {a.steps_hmm} steps, {states} states"),
        "nested": (plates.data(a.groups, a.members), plates.nested, ["mu"],
                   f"nested plates, {a.groups} × {a.members}"),
    }[kind]
    step, first, start, np_model, nesting, form = numpyro_side(kind, data, states, key)
    summed = gv.marginal(model, keep=keep, algorithm=gv.enumeration())
    auto = gv.auto_normal(summed, init=gv.init_to_value(start))
    init, genvi_step = gv.training_step(gv.elbo(summed, auto), optax.adam(LR))
    genvi_state = init({"guide": auto.init(key, {}, data)}, key)
    genvi_loop = scanned(lambda s: genvi_step(s, data)[0])
    numpyro_loop = scanned(step)
    loops = {"genvi": lambda: genvi_loop(genvi_state), "NumPyro": lambda: numpyro_loop(first)}
    for loop in loops.values():
        jax.block_until_ready(loop())
    genvi_value = float(summed.log_density(gv.choices(start), {}, data))
    numpyro_value = float(enum_log_density(enum(config_enumerate(np_model), -nesting - 1),
                                           (data,), {}, start)[0])
    return Case(label, form, loops, genvi_value - numpyro_value)


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", choices=MODELS, default=MODELS)
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--repeat", type=int, default=1, help="runs of the whole timing")
    p.add_argument("--points", type=int, default=1000)
    p.add_argument("--steps-hmm", type=int, default=100)
    p.add_argument("--steps-long", type=int, default=1000)
    p.add_argument("--sequences", type=int, default=50)
    p.add_argument("--states", type=int, default=5)
    p.add_argument("--groups", type=int, default=100)
    p.add_argument("--members", type=int, default=20)
    p.add_argument("--record", action="store_true",
                   help="write the table to docs/benchmarks/enumeration.md")
    a = p.parse_args(argv)
    print(describe_machine(), flush=True)
    cases: dict[str, Case] = {}
    for kind in a.models:
        t0 = time.perf_counter()
        cases[kind] = build(kind, a)
        print(f"{kind}: built and compiled in {time.perf_counter() - t0:.1f} s", flush=True)
    ms: dict[str, dict[str, list[float]]] = {k: {"genvi": [], "NumPyro": []} for k in cases}
    ratios: dict[str, list[float]] = {k: [] for k in cases}
    for r in range(a.repeat):
        for kind, case in cases.items():
            samples = interleaved_samples(case.loops, rounds=a.rounds, reps=1)
            for side in ms[kind]:
                ms[kind][side].append(1e3 * median(samples[side]) / LOOP)
            ratios[kind].append(paired_ratio(samples, "genvi", "NumPyro"))
        print(f"run {r + 1}/{a.repeat}, × NumPyro: " + ", ".join(
            f"{kind} {ratios[kind][-1]:.3f}" for kind in cases), flush=True)
    header = ["model", "NumPyro's form", "genvi ms / step", "NumPyro ms / step", "× NumPyro",
              "log p: genvi − NumPyro"]
    rows = [[case.label, case.form, f"{median(ms[k]['genvi']):.4f}",
             f"{median(ms[k]['NumPyro']):.4f}", f"{median(ratios[k]):.3f}",
             f"{case.difference:.2g}"] for k, case in cases.items()]
    print(f"\nwarm ms per step in a compiled loop of {LOOP}, {a.rounds} interleaved rounds"
          + (f", medians of {a.repeat} runs" if a.repeat > 1 else "") + "\n")
    print("| " + " | ".join(header) + " |\n|" + "---|" * len(header))
    for row in rows:
        print("| " + " | ".join(row) + " |")
    if a.record:
        record("enumeration_peers", command("enumeration.peers", argv), header, rows)
    return {"ratios": ratios, "ms": ms, "differences": {k: c.difference for k, c in cases.items()}}


if __name__ == "__main__":
    main()
