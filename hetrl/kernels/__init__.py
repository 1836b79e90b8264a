"""Learner kernels: they wrap an algorithm from outside and run its `learn` faster over the same state."""
