"""Running NeMo Gym: the merged config, server processes in the dedicated NeMo Gym environment, the
run adapter that drives an agent's POST /run, and `relax-gym up`.

`launch` is the one module that runs inside the NeMo Gym environment; it imports only the standard
library and NeMo Gym itself.
"""
