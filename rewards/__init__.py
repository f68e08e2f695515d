"""Rewards: progress-reward models, labels, success detectors, costs, metrics (core only)."""
