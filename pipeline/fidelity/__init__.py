"""Closed-loop fidelity (issue 31): held-out trajectories replayed through a simulator, step by step, scored and aggregated."""
