"""Scripts that run INSIDE a rollout's sandbox with the system python (``python3 -I -S``, 3.11+).

They are copied read-only into the sandbox (``/opt/relax-gym``); they read a JSON request on stdin and
never see the host: every file they touch is resolved by the sandbox's own mounts, as the rollout's uid.
"""
