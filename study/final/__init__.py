"""python -m study.final: a config, a grid or a study's pick retrained on all training classes and tested (cli.py)."""
