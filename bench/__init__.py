"""Benchmarks: each measures tally side by side with a baseline in the same run."""
