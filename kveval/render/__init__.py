"""Outputs for people: review.md, CSV tables and figures, from evidence and verdict only."""
