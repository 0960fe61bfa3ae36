"""relax-gym plugin: reasoning-gym tasks solved by the Claude Code CLI per trial, scored by NeMo Gym's
reasoning_gym resources server (the reasoning_gym environment).

Imports nothing on purpose: importing the package must not start, read or check anything.
"""
