"""LeRobot's policies inside the toolkit: a policy ``lerobot-train`` saved loads with
``Policy.from_pretrained(dir)`` (its config.json has LeRobot's ``type``), acts in the toolkit's
environments, gets exact DPPO log-probabilities for GRPO / TPO, and saves back in LeRobot's
layout. LeRobot itself is imported only when such a policy is built."""

from embodied.policies.lerobot.config import LeRobotPolicyConfig
from embodied.policies.lerobot.policy import LeRobotPolicy

__all__ = ["LeRobotPolicy", "LeRobotPolicyConfig"]
