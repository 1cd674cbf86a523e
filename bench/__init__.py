"""The product's benchmarks, each run as ``python -m bench.NAME``, its bound in its docstring (bench/harness.py)."""
