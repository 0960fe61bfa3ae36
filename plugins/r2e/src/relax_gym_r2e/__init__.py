"""relax-gym plugin for R2E-Gym style repository repair (environment r2e_gym).

Imports nothing on purpose: ``relax_gym_r2e.server`` (with ``sandbox``, ``workspace`` and ``tasks``) runs
inside the NeMo Gym environment, the other modules inside the gateway (with relax-gym-core).
"""
