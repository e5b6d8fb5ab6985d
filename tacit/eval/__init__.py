"""Accuracy measurements of one model against another (`tacit eval ...`)."""
