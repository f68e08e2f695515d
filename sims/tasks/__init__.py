"""The built-in tabletop tasks, one module each (``base`` holds what they share).

A task module holds everything about its task, expert and episode length included, and registers it
with ``embodied.sims.registry.register_task``; ``embodied.sims`` imports the built-in ones.
"""
