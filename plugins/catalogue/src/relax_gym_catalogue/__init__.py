"""relax-gym plugin: the NeMo Gym catalogue (plugin.py registers it; servers.py runs inside NeMo Gym).

Kept empty: servers.py is imported inside the NeMo Gym environment, which has none of the core's
dependencies, so importing this package must not import the plugin.
"""
