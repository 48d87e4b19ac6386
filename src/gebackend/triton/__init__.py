"""The Triton side: the thin `model.py` adapter and the bridge between Triton's Python backend API and the runtime."""
