"""`relax-gym new NAME --own-server [--dir DIR]`: a new environment plugin that, as generated, installs, is
listed, probes green and passes the conformance kit, in the layout that works in both interpreters.

The plugin is a distribution of its own: its entry point at `<package>.plugin` (relax-gym's side), its
NeMo Gym resources server at `<package>.server` (the NeMo Gym environment's side), an import-free package
`__init__` between them, its rows shipped as package data, and a test class of the conformance kit. The
files come from templates/own (string.Template, `$name` and the like); nothing is copied from another
plugin. Inside this repository (DIR is its plugins/) the plugin joins the uv workspace, so `make` picks it
up; elsewhere it is installed with `pip install -e`.
"""

from __future__ import annotations

import keyword
import re
import shutil
import tempfile
from importlib import resources
from pathlib import Path
from string import Template

from relax_gym_core.errors import ConfigError
from relax_gym_core.plugin.host import make_plugin_manager

_NAME = re.compile(r"[a-z][a-z0-9_]{0,23}")
TEMPLATES = "templates/own"
# template (under TEMPLATES) -> where it goes in the plugin (with $package and $name filled in)
FILES = {
    "pyproject.toml.tmpl": "pyproject.toml",
    "README.md.tmpl": "README.md",
    "src/__init__.py.tmpl": "src/$package/__init__.py",
    "src/plugin.py.tmpl": "src/$package/plugin.py",
    "src/server.py.tmpl": "src/$package/server.py",
    "src/example.jsonl.tmpl": "src/$package/data/example.jsonl",
    "tests/test_contract.py.tmpl": "tests/test_${name}_contract.py",
}
WORKSPACE = "\n[tool.uv.sources]\nrelax-gym-core = { workspace = true }\n"
RUFF = (
    '\n[tool.ruff]\nextend = "../../pyproject.toml"\nsrc = ["src", "tests"]\n\n'
    '[tool.ruff.lint.per-file-ignores]\n"tests/**" = ["S", "PLR", "TRY", "B011"]\n'
)


def _checked(name: str) -> str:
    if not _NAME.fullmatch(name) or keyword.iskeyword(name):
        raise ConfigError(
            f"{name!r} is not a usable environment name: lower-case letters, digits and underscores, "
            "starting with a letter (it names the package relax_gym_<name> too)"
        )
    return name


def _in_workspace(directory: Path) -> bool:
    """Whether `directory` is the plugins/ directory of a uv workspace whose members are plugins/*."""
    root = directory.resolve().parent / "pyproject.toml"
    return (
        directory.resolve().name == "plugins" and root.is_file() and "[tool.uv.workspace]" in root.read_text()
    )


def default_directory(cwd: Path) -> Path:
    """./plugins inside relax-gym's repository (make picks a new plugin up there), else the current one."""
    return cwd / "plugins" if _in_workspace(cwd / "plugins") else cwd


def render(name: str, *, workspace: bool) -> dict[str, str]:
    """The generated plugin: its files by path (relative to the plugin's directory), as text."""
    package = f"relax_gym_{name}"
    words = {
        "name": name,
        "package": package,
        "distribution": f"relax-gym-{name.replace('_', '-')}",
        "classname": "".join(part.capitalize() for part in name.split("_")),
        "constant": name.upper(),
        "workspace": WORKSPACE if workspace else "",
        "ruff": RUFF if workspace else "",
        "tests": f"plugins/{name}/tests" if workspace else "tests",
        "install": (
            "Inside relax-gym's repository `make` (and `make test`) installs it with the others, in both "
            "environments; outside it:\n\n```bash\npip install -e .          # relax-gym's environment\n"
            "$RELAX_GYM_NEMO_GYM_PYTHON -m pip install --no-deps -e .   # the NeMo Gym environment\n```"
        ),
    }
    files = resources.files("relax_gym_core.commands").joinpath(TEMPLATES)
    return {
        Template(target).substitute(words): Template(files.joinpath(source).read_text()).substitute(words)
        for source, target in FILES.items()
    }


def new_plugin(name: str, *, own_server: bool, directory: Path | None = None) -> str:
    """Write the plugin to DIR/NAME (whole or not at all) and say what to fill in and how to install it."""
    if not own_server:
        raise ConfigError(
            "relax-gym new makes an environment with a verifier of its own: add --own-server (an environment "
            "on an upstream NeMo Gym server is registered by the catalogue plugin: relax-gym plugins)"
        )
    name = _checked(name)
    taken = {definition.name for definition in make_plugin_manager().environments}
    if name in taken:
        raise ConfigError(
            f"environment {name!r} is already registered by an installed plugin: choose another name"
        )
    parent = (directory or default_directory(Path.cwd())).resolve()
    target = parent / name
    if target.exists():
        raise ConfigError(f"{target} already exists: nothing was written")
    if not parent.is_dir():
        raise ConfigError(f"{parent} is not a directory: nothing was written")
    workspace = _in_workspace(parent)
    staging = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=parent))
    try:
        for relative, text in render(name, workspace=workspace).items():
            path = staging / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
        staging.rename(target)  # whole or not at all
    finally:
        shutil.rmtree(staging, ignore_errors=True)  # gone already when it became the plugin
    package = f"relax_gym_{name}"
    install = (
        "make env gym    # picks up the new plugins/ directory, in both environments"
        if workspace
        else f"pip install -e {target}   # and into the NeMo Gym environment: "
        f"$RELAX_GYM_NEMO_GYM_PYTHON -m pip install --no-deps -e {target}"
    )
    return "\n".join(
        (
            f"Created {target}",
            "Fill in:",
            f"  src/{package}/server.py         verify(): how an answer is scored",
            f"  src/{package}/data/example.jsonl  your rows (the prompt, and the fields verify() reads)",
            f"  src/{package}/plugin.py         check_row() and verifier_probes() for those rows",
            "Then:",
            f"  {install}",
            f"  relax-gym probe {name}",
        )
    )
