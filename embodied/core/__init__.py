"""The base layer: the types and contracts every other part imports, and nothing of the project.

``Trajectory`` (one episode), feature names and ``ObservationSpec``/``ActionSpec``, the ``Policy``
and ``RewardModel`` contracts, neural building blocks, Hugging Face style save/load, atomic writes,
typed configs with their checks, and run directories.
"""
