"""Training algorithms, one file each: bc, reward, grpo, preference."""
