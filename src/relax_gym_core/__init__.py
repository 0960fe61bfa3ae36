"""relax-gym core."""
