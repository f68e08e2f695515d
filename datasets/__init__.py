"""Datasets: LeRobot v3 trajectory datasets and PyTorch views of them. Imports only the core."""
