"""Launching a real tritonserver (from the nvidia-pytriton wheel) with the `ge` backend laid out beside it."""
