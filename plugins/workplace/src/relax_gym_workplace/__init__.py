"""relax-gym plugin for NeMo Gym's workplace_assistant environment.

Imports nothing on purpose: ``relax_gym_workplace.server`` runs inside the NeMo Gym environment, the
other modules inside the gateway (with relax-gym-core).
"""
