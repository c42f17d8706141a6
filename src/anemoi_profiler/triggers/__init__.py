"""Profiling windows that open themselves: detectors fed with the per-interval figures, and their budget."""
