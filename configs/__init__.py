"""Fixed training configs for study.final --config; DEFAULT_CONFIG is the one it trains when given none."""

DEFAULT_CONFIG = "omniglot_hbn.yaml"
