"""relax-gym plugin for NeMo Gym's math_with_judge verifier: the gsm8k and math_with_judge environments.

Imports nothing on purpose: importing the package must not read the judge settings or any data.
"""
