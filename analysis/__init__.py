"""Entropy math, statistics and the paper's figures and tables."""
