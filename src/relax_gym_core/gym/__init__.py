"""Running NeMo Gym: the merged config, server processes in the dedicated NeMo Gym environment (spawn.py,
the fork server, the launcher), which release is installed (release.py), its installed files
(installed.py), and verifier probes scored by a real resources server (probe.py).

`launch` and `forkserver` run inside the NeMo Gym environment; they import only the standard library and
NeMo Gym itself (as `installed` does when it runs there).
"""
