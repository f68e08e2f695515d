"""Rollouts: a policy (or the scripted expert) driving vector envs into ``Trajectory`` objects,
the check that a policy and an env fit, and the local and Ray backends GRPO and TPO sample on."""
