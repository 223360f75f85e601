"""Cloudflare Clef / Clef-flash (family `clef`): every question of a request in one sequence (layout.py), read
jointly by the joint schema head (head.py) on the causal-lm-joint backend; readout.py."""
