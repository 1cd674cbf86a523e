"""Study orchestration: launching searches, tracking in MLflow, final training and reports."""
