"""relax-gym plugin for NeMo Gym's calendar environment (upstream's servers, unchanged; rows, probes and
result mapping here)."""
