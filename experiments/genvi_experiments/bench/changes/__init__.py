"""genvi against its own earlier commits: fingerprints of the programs genvi compiles
for the speed benchmarks' steps, to diff between two commits
(`program_fingerprints`), and `gv.fit`'s own cost beyond its steps (`fit_overhead`);
any benchmark runs at a base commit beside the working tree with
`genvi_experiments.bench.against`. Page: docs/benchmarks/changes.md.
"""
