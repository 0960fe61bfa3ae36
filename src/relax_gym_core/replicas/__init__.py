"""Replicas: independent copies of an environment's NeMo Gym servers behind one gateway runtime.

spec.py says what a replica is and what a launcher does; local.py starts replicas as local processes,
ray.py as Ray actors (through ray_host.py, which runs in the NeMo Gym environment, so this package's
__init__ imports nothing); pool.py is the runtime that places trials on them, watches their health and
replaces lost ones.
"""
