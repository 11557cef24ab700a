"""How far a simulator can be trusted: closed-loop rollouts and policy agreement against the real environments (issue 31)."""
