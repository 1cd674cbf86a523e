"""The product's benchmarks, each run from the repository root as ``python -m bench.NAME``: its docstring states the
workload, the question and the acceptance bound, and it ends by printing whether the bound held (bench/harness.py)."""
