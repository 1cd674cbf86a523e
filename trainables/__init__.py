"""Trainables: the pure-PyTorch training core and the Ray Tune trainable that wraps it."""
