"""The relax-gym environment countdown.

Two interpreters import this package: relax-gym's imports its plugin module (the entry point), the NeMo
Gym environment's its server module. This file imports nothing, so neither side drags in what the other
has and it lacks."""
