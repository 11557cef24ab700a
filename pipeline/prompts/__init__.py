"""Prompt templates, one module per stage: CPT uses its own fixed template (cpt.py), SFT draws from
ten wordings of the same information, RL uses another (SPEC.md)."""
