"""Run one NeMo Gym server in this process, without Ray (runs INSIDE the NeMo Gym environment).

    python -m relax_gym_core.gym.launch --server-class responses_api_agents.simple_agent.app:SimpleAgent

The merged config arrives the way `gym env start` passes it (NEMO_GYM_CONFIG_DICT, NEMO_GYM_CONFIG_PATH).
We do what NeMo Gym's run_webserver does, minus initialize_ray(): none of the servers we run use Ray, and
a private Ray cluster per server costs ~11 s and ~875 MB each. Imports: standard library and NeMo Gym only.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import importlib.util
import re
import signal
import sys
from typing import Any


def _upstream_on_path(package: str) -> None:
    """Put the upstream server's directory first on sys.path, as NeMo Gym's own `python app.py` does:
    some upstream apps import their siblings as top-level modules (calendar: `from utils import ...`)."""
    spec = importlib.util.find_spec(package)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    if locations and locations[0] not in sys.path:
        sys.path.insert(0, locations[0])


def _core_dependencies() -> set[str]:
    """The import names of relax-gym-core's own dependencies (its installed metadata), extras included."""
    try:
        requires = importlib.metadata.requires("relax-gym-core") or []
    except importlib.metadata.PackageNotFoundError:
        return set()
    names = (re.split(r"[\s;<>=!~\[(]", requirement, maxsplit=1)[0] for requirement in requires)
    return {name.lower().replace("-", "_") for name in names if name}


def _why_not(module_name: str, exc: ImportError) -> str:
    """Why a server module cannot be imported here, with what to do when the missing module is one of
    relax-gym's own dependencies: this interpreter is the NeMo Gym environment's, which has NeMo Gym's
    dependencies, not the core's (adding them to it would hide the mistake, not fix it)."""
    why = f"({type(exc).__name__}: {exc})"
    missing = (getattr(exc, "name", None) or "").split(".")[0]
    if not missing or missing.lower() not in _core_dependencies():
        return why
    return (
        f"{why}: {missing} is a dependency of relax-gym's own environment, not of the NeMo Gym environment "
        f"that runs servers. A server module may import the standard library, NeMo Gym, its own packages "
        f"(nemo-gym-requirements.txt) and relax_gym_core.ingym only: keep it apart from the plugin's code, "
        f"with the entry point at `<package>.plugin` and a package __init__ that imports nothing "
        f'(docs/plugins.md, "What a plugin may import")'
    )


def server_class(spec: str) -> Any:
    """The class a server runs, or SystemExit with one line naming it and why (`relax-gym up` and `probe`
    show the server's last lines: a wrong server_class is a plugin's mistake, not a traceback)."""
    module_name, _, class_name = spec.partition(":")
    if not module_name or not class_name:
        raise SystemExit(f"--server-class must look like module:Class (got {spec!r})")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise SystemExit(
            f"server class {spec}: module {module_name} cannot be imported in the NeMo Gym environment "
            f"{_why_not(module_name, exc)}"
        ) from None
    try:  # a module may build its classes on first use (a module __getattr__) and need more imports then
        found = getattr(module, class_name, None)
    except ImportError as exc:
        raise SystemExit(
            f"server class {spec}: {class_name} cannot be loaded in the NeMo Gym environment "
            f"{_why_not(module_name, exc)}"
        ) from None
    if not isinstance(found, type):
        raise SystemExit(f"server class {spec}: {module_name} has no class {class_name}")
    return found


def serve(server_class: Any, *, log_level: str = "warning") -> None:
    import uvicorn  # noqa: PLC0415 - only available inside the NeMo Gym environment
    from nemo_gym.global_config import get_global_config_dict  # noqa: PLC0415
    from nemo_gym.server_utils import ServerClient  # noqa: PLC0415

    config = server_class.load_config_from_global_config()
    client = ServerClient(
        head_server_config=ServerClient.load_head_server_config(), global_config_dict=get_global_config_dict()
    )
    server = server_class(config=config, server_client=client)
    app = server.setup_webserver()
    server.setup_liveness(app)
    server.setup_exception_middleware(app)
    uvicorn.run(
        app,
        host=config.host,
        port=config.port,
        log_level=log_level,
        timeout_graceful_shutdown=1,
        timeout_keep_alive=30,
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server-class", required=True)
    parser.add_argument("--upstream", help="the upstream server package, e.g. resources_servers.calendar")
    parser.add_argument("--log-level", default="warning")
    args = parser.parse_args(argv)
    # A background launch may inherit SIGINT as ignored, and a launcher's thread may have it blocked (a Ray
    # worker's does, and the mask outlives exec): we are stopped by signal, so restore both.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})
    if args.upstream:
        _upstream_on_path(args.upstream)
    serve(server_class(args.server_class), log_level=args.log_level)


if __name__ == "__main__":
    main()
