"""Rewards: progress-reward models, labels, success detectors, costs, metrics. Imports only the core."""
