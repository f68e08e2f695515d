"""Training, one algorithm a file that reads top to bottom (bc, reward, grpo, tpo), on one shared
loop (``loop.py``: run directory, resume, seeding, NaN stop, clipping, checkpoints)."""
