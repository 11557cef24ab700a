"""How far a simulator can be trusted (issue 31): held-out trajectories replayed open and closed loop, and scripted
policies run in the real environments and in the simulator."""
