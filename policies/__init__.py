"""Policies: VLA and diffusion/flow planners (see DESIGN.md). Imports only the core."""
