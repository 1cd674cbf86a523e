"""python -m study.launch: a hyperparameter study on Ray Tune, searched with Optuna, recorded in MLflow (cli.py)."""
