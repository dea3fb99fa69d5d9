"""AIR training step: every genvi estimator beside Pyro's `TraceGraph_ELBO` (with and
without neural baselines) and `TraceEnum_ELBO`, the same model, networks and data
(`experiments/genvi_experiments/air`, `experiments/genvi_experiments/bench/air/in_pyro.py`),
timed interleaved in one process at one batch size (like the paper's Table 2). Pyro
runs twice: with the image's share of the LSTM input computed once per image, as
genvi's AIR does (the fair pair), and with the LSTMCell on the concatenated input as
in Pyro's AIR example ("example LSTM"). Pyro runs on torch's GPU where torch sees
one, else on the CPU. Needs `pip install -e ".[pyro]"`.

    python -m genvi_experiments.bench.air.step [--batch 64] [--rounds 10] [--estimators ...]
        [--no-pyro] [--record]

`--record` writes the table (as `air_step`, with `_gpu` appended on a GPU) through
`genvi_experiments.bench.results`.
"""

from __future__ import annotations

import argparse

import jax
import numpy as np

from genvi_experiments.air.config import AIRConfig
from genvi_experiments.air.data import make_canvases
from genvi_experiments.air.estimators import ESTIMATORS, air_objective
from genvi_experiments.air.model import AIRNets
from genvi_experiments.air.train import air_optimizer, make_step
from genvi_experiments.bench.results import command, on_platform, record
from genvi_experiments.common.timing import (compile_time, describe_machine, interleaved_samples,
                                            median, paired_ratio)

#: (Pyro estimator, genvi estimator) pairs whose per-step ratio the issue asks for.
PAIRS = [("tracegraph", "reinforce"), ("tracegraph_baselines", "baseline"),
         ("tracegraph", "mvd"), ("traceenum", "enum")]


def genvi_air_step(cfg: AIRConfig, name: str, batch: np.ndarray, seed: int = 0):
    """A zero-argument function running one jitted genvi training step on `batch`,
    and its compile time."""
    nets = AIRNets(cfg)
    objective, _, _ = air_objective(cfg, nets, name)
    optimizer = air_optimizer(cfg)
    params = nets.init(jax.random.key(seed), baseline=ESTIMATORS[name].baseline)
    data = jax.numpy.asarray(batch)
    step = jax.jit(make_step(objective, optimizer, data, len(batch)))
    carry = (params, optimizer.init(params))
    key = jax.random.key(seed + 1)
    seconds = compile_time(step, carry, key)
    return (lambda: step(carry, key)), seconds


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--estimators", nargs="+", default=[e for e in ESTIMATORS if e != "rws"],
                    choices=sorted(ESTIMATORS))
    ap.add_argument("--no-pyro", action="store_true", help="time genvi only")
    ap.add_argument("--record", action="store_true",
                    help="write the table to docs/benchmarks/air.md")
    args = ap.parse_args(argv)
    cfg = AIRConfig()
    batch = make_canvases(train=args.batch, test=1).train
    fns, compile_s = {}, {}
    for name in args.estimators:
        fns[name], compile_s[name] = genvi_air_step(cfg, name, batch)
    header = f"# AIR step, batch {args.batch}, {describe_machine()}"
    if not args.no_pyro:
        import torch
        from genvi_experiments.bench.air.in_pyro import ESTIMATORS as PYRO, pyro_air_step
        from genvi_experiments.bench.systems import torch_device
        device = torch_device()
        tbatch = torch.from_numpy(batch).to(device)
        for name in PYRO:
            for hoist, suffix in ((True, ""), (False, " (example LSTM)")):
                step = pyro_air_step(cfg, name, hoist=hoist, device=device)
                step(tbatch)
                fns["pyro " + name + suffix] = (lambda s=step: s(tbatch))
        header += f", torch {torch.__version__} on {device} ({torch.get_num_threads()} threads)"
    samples = interleaved_samples(fns, rounds=args.rounds, reps=2, warmup=1)
    print(header)
    print("| system / estimator | ms per step | compile (s) |\n|---|---|---|")
    rows = []
    for name, s in samples.items():
        rows.append({"name": name, "ms": 1e3 * median(s), "compile": compile_s.get(name)})
        c = f"{compile_s[name]:.1f}" if name in compile_s else "–"
        print(f"| {name} | {1e3 * median(s):.1f} | {c} |")
    print("\n| ratio (median of per-round ratios) | value |\n|---|---|")
    if "reinforce" in samples:
        for other in ("enum", "mvd", "hybrid", "baseline"):
            if other in samples:
                print(f"| genvi {other} / genvi reinforce | {paired_ratio(samples, other, 'reinforce'):.2f} |")
    for pyro, ours in PAIRS:
        for suffix in ("", " (example LSTM)"):
            if "pyro " + pyro + suffix in samples and ours in samples:
                r = paired_ratio(samples, "pyro " + pyro + suffix, ours)
                print(f"| Pyro {pyro}{suffix} / genvi {ours} | {r:.2f} |")
                rows.append({"name": f"pyro {pyro}{suffix} / {ours}", "ratio": r})
    if args.record:
        ratios = {r["name"]: r["ratio"] for r in rows if "ratio" in r}
        record(on_platform("air_step"), command("air.step", argv),
               ["system / estimator", "ms per step", "compile (s)", "÷ genvi (median paired ratio)"],
               [[_label(r["name"]), f"{r['ms']:.2f}",
                 "–" if r["compile"] is None else f"{r['compile']:.1f}",
                 _ratio_to_genvi(r["name"], ratios)] for r in rows if "ms" in r])
    return rows


def _label(name: str) -> str:
    return ("Pyro " + name.removeprefix("pyro ")) if name.startswith("pyro ") else f"genvi {name}"


def _ratio_to_genvi(name: str, ratios: dict[str, float]) -> str:
    """A Pyro row's time over its genvi pair's (PAIRS), "–" for genvi's rows."""
    found = [f"{ratios[key]:.2f} (÷ {key.split(' / ')[1]})" for key in ratios
             if name.startswith("pyro ") and key.split(" / ")[0] == name]
    return "; ".join(found) or "–"


if __name__ == "__main__":
    main()
