"""Datasets: LeRobot v3 trajectory datasets and PyTorch views of them. Imports only the core."""

from embodied.datasets import lerobot
from embodied.datasets.lerobot import *  # noqa: F403 (the public names of the LeRobot format)

__all__ = list(lerobot.__all__)
