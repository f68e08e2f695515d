"""Datasets: LeRobot v3 trajectory datasets and PyTorch views of them. Imports only the core."""

from embodied.datasets.lerobot import (
    CODEBASE_VERSION,
    DatasetBusyError,
    DatasetError,
    LeRobotDataset,
    LeRobotDatasetWriter,
    dataset_summary,
    validate_dataset,
)

__all__ = [
    "CODEBASE_VERSION",
    "DatasetBusyError",
    "DatasetError",
    "LeRobotDataset",
    "LeRobotDatasetWriter",
    "dataset_summary",
    "validate_dataset",
]
