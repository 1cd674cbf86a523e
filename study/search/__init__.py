"""The search as Ray Tune plug-ins: the spaces' grammar, Optuna as a searcher, the schedulers and their halving, how a
trial ended, the race over validation folds, the Optuna journal. Imports no MLflow."""
