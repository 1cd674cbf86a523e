"""python -m study.report: the report of a study or of a grid of final runs, from MLflow (cli.py)."""
