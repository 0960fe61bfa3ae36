"""The hidden-test runner, run inside the evaluation sandbox: ``FILE.py::function`` ids, no pytest needed.

Request on stdin: {"tests": [ids]}. Every test runs in this process (the sandbox bounds it: time,
processes, memory); the verdicts go out as the last stdout line, after MARKER, as JSON {id: "passed" |
"failed" | "error"}. A test the runner never reports (it hung, or the code under test killed the process)
counts as failed on the host side.
"""

import importlib.util
import json
import os
import sys
import traceback
from types import ModuleType

REPO = "/workspace/repo"
MARKER = "@@relax-gym-test-results@@"


def load(path: str, modules: dict[str, ModuleType]) -> ModuleType:
    if path not in modules:
        name = "r2e_hidden_" + path.replace("/", "_").removesuffix(".py")
        spec = importlib.util.spec_from_file_location(name, os.path.join(REPO, path))
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot load {path}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        modules[path] = module
    return modules[path]


def run(test_id: str, modules: dict[str, ModuleType]) -> str:
    path, _, name = test_id.partition("::")
    try:
        function = getattr(load(path, modules), name)
    except Exception:  # noqa: BLE001 - an unloadable test is an error, never a crash of the runner
        traceback.print_exc()
        return "error"
    try:
        function()
    except BaseException as exc:  # a test that raises anything (even SystemExit) failed
        if isinstance(exc, KeyboardInterrupt):
            raise
        traceback.print_exc()
        return "failed"
    return "passed"


def main() -> int:
    request = json.loads(sys.stdin.read())
    sys.stdin.close()
    os.chdir(REPO)
    sys.path.insert(0, REPO)
    modules: dict[str, ModuleType] = {}
    verdicts: dict[str, str] = {}
    for test_id in request["tests"]:
        verdicts[test_id] = run(test_id, modules)
        print(f"{test_id}: {verdicts[test_id]}", flush=True)
    sys.stdout.write("\n" + MARKER + json.dumps(verdicts) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
