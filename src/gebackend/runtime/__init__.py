"""Runtime: what happens to a batch of requests between Triton and the engine."""
