"""relax-gym core: trials between the Relax trainer and NeMo Gym environments.

Imports nothing eagerly: parts of this package run inside Relax's interpreter (the thin client) and
inside the NeMo Gym environment (the server launcher), which have different dependencies.
"""

from typing import Any


def __getattr__(name: str) -> Any:
    if name == "hookimpl":  # plugins write `from relax_gym_core import hookimpl`
        from relax_gym_core.plugin.hookspecs import hookimpl  # noqa: PLC0415

        return hookimpl
    raise AttributeError(name)
