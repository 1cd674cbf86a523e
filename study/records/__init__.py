"""What a study and a final record: the study's settings as params, the parent run, the trials' spool and its writer,
the end of a study, its artifacts and curves, MLflow plumbing, the local store, utilization and the locks."""
