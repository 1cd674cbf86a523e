"""python -m study.serve: the final model over REST, behind request limits (``guard``)."""
