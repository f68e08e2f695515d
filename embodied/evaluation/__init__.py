"""Evaluation: success with Wilson intervals on held-out seeds for every suite, reward-model
evaluation (VOC, AUROC), videos, and the reports a person opens."""
