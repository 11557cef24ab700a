"""Scoring a predicted observation against the real one: rule (sandboxed verifiers), rubrics for an LLM judge,
the offline judge (semantic.py, with its text and JSON agreement parts). Shared by the SFT judge, the RL
rewards and evaluation."""
