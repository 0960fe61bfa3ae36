"""`relax-gym`: the command line. Each subcommand lives in its own small function."""

from __future__ import annotations

import argparse
import logging
import os
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from relax_gym_core.errors import RelaxGymError


def _gateway_options(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "host": args.host,
        "port": args.port,
        "callback_hosts": args.callback_host,
        "callback_networks": args.callback_network,
        "log_level": args.log_level,
        "state_dir": args.state_dir,
    }


def _serve(args: argparse.Namespace) -> int:
    from relax_gym_core.commands.serve import serve  # noqa: PLC0415

    serve(environments=args.environments, **_gateway_options(args))
    return 0


def _plugins(args: argparse.Namespace) -> int:
    from relax_gym_core.commands.plugins import plugins  # noqa: PLC0415

    print(plugins(as_json=args.json))  # noqa: T201
    return 0


def _new(args: argparse.Namespace) -> int:
    from relax_gym_core.commands.new import new_plugin  # noqa: PLC0415

    print(new_plugin(args.name, own_server=args.own_server, directory=args.dir))  # noqa: T201
    return 0


def _convert(args: argparse.Namespace) -> int:
    from relax_gym_core.commands.convert import convert  # noqa: PLC0415

    print(convert(args.environment, args.input, args.output, limit=args.limit))  # noqa: T201
    return 0


def _mix(args: argparse.Namespace) -> int:
    from relax_gym_core.commands.mix import mix  # noqa: PLC0415

    print(mix(args.sources, args.output, seed=args.seed))  # noqa: T201
    return 0


def _up(args: argparse.Namespace) -> int:
    from relax_gym_core.commands.up import up  # noqa: PLC0415

    up(
        args.environments,
        max_concurrency=args.max_concurrency,
        replicas=args.replicas,
        ray=args.ray,
        resources=args.replica_resources,
        observability=args.nemo_gym_observability,
        **_gateway_options(args),
    )
    return 0


def _probe(args: argparse.Namespace) -> int:
    from relax_gym_core.commands.probe import probe  # noqa: PLC0415

    text, ok = probe(args.environment, as_json=args.json, verifier_url=args.verifier_url)
    print(text)  # noqa: T201
    return 0 if ok else 1


def _relax_args(args: argparse.Namespace) -> int:
    from relax_gym_core.commands.relax_args import DEFAULT_GATEWAY, flags, problems  # noqa: PLC0415

    if args.check is None:
        print(flags(args.environments, gateway=args.gateway or DEFAULT_GATEWAY, deadline_s=args.deadline_s))  # noqa: T201
        return 0
    found = problems(args.environments, args.check, gateway=args.gateway, deadline_s=args.deadline_s)
    for problem in found:
        print(f"relax-gym relax-args: {problem}", file=sys.stderr)  # noqa: T201
    if found:
        return 2
    print("relax-gym relax-args: the command line runs these environments' trials")  # noqa: T201
    return 0


def _rollout(args: argparse.Namespace) -> int:
    from relax_gym_core.rollout.engine import RolloutOptions, rollout  # noqa: PLC0415

    options = {key: getattr(args, key) for key in RolloutOptions.__annotations__ if hasattr(args, key)}
    # The key is never a flag (it comes from --api-key-env), so the command line is safe to print back.
    return rollout(RolloutOptions(**options, resume_command=shlex.join(["relax-gym", *args.argv])))


def _report(args: argparse.Namespace) -> int:
    from relax_gym_core.rollout.report import report  # noqa: PLC0415

    print(report(args.directories, output=args.output))  # noqa: T201
    return 0


def _reverify(args: argparse.Namespace) -> int:
    from relax_gym_core.rollout.reverify import reverify  # noqa: PLC0415

    text, same = reverify(args.directory, as_json=args.json)
    print(text)  # noqa: T201
    return 0 if same else 1


def _add_rollout(commands: Any) -> None:
    rollout = commands.add_parser(
        "rollout",
        help="run every row of a dataset K times as real trials against a model endpoint (resumable)",
    )
    rollout.add_argument(
        "target",
        nargs="?",
        metavar="ENV[:CONFIG]",
        help="where every row runs (leave out for a `relax-gym mix` file: each row's tag routes it)",
    )
    rollout.add_argument("--data", required=True, metavar="RELAX.jsonl", help="converted or mixed rows")
    rollout.add_argument(
        "--policy",
        required=True,
        metavar="URL|oracle[:P]",
        help="an OpenAI- or Anthropic-compatible endpoint (vLLM, SGLang, a hosted API), or `oracle` (the "
        "plugins' known-good answers; oracle:P answers known-bad at rate P)",
    )
    rollout.add_argument("--model", help="model name sent to the policy (default: the first it lists)")
    rollout.add_argument(
        "--api-key-env", metavar="VAR", help="environment variable holding the policy's API key"
    )
    rollout.add_argument("--repeats", type=int, default=1, metavar="K", help="trials per row (default 1)")
    rollout.add_argument(
        "--concurrency", type=int, default=8, metavar="C", help="trials in flight at once (default 8)"
    )
    rollout.add_argument("--limit", type=int, metavar="N", help="only the first N rows")
    rollout.add_argument(
        "--out", metavar="DIR", help="results (trials.jsonl, summary.json); default rollouts/<data name>"
    )
    rollout.add_argument("--gateway", metavar="URL", help="use this running gateway instead of starting one")
    rollout.add_argument(
        "--port", type=int, default=0, help="port of the gateway this command starts (default: a free one)"
    )
    rollout.add_argument(
        "--deadline-s", type=float, default=900.0, help="deadline of each trial in seconds (default 900)"
    )
    rollout.add_argument("--seed", type=int, default=0, help="seed of oracle:P's known-bad draws (default 0)")
    rollout.add_argument(
        "--pass-threshold",
        type=float,
        default=1.0,
        help="reward at or above which a trial counts as a pass for pass@k (default 1.0)",
    )
    rollout.set_defaults(run=_rollout)
    report = commands.add_parser(
        "report", help="one self-contained HTML report of a rollout directory, or two side by side"
    )
    report.add_argument("directories", nargs="+", metavar="DIR", help="one rollout --out, or two to compare")
    report.add_argument(
        "--output",
        metavar="FILE.html",
        help="where to write it (default DIR/report.html or DIR/compare.html)",
    )
    report.set_defaults(run=_report)
    again = commands.add_parser(
        "reverify",
        help="re-score a rollout's stored trajectories with the current verifiers (exit 1: a reward changed)",
    )
    again.add_argument("directory", metavar="DIR", help="a rollout --out")
    again.add_argument("--json", action="store_true", help="print every re-scored trial as JSON")
    again.set_defaults(run=_reverify)


def _add_gateway_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument(
        "--port", type=int, default=28100, help="port to bind; 0 picks a free one (default 28100)"
    )
    parser.add_argument(
        "--callback-network",
        action="append",
        default=[],
        metavar="CIDR",
        help="callback network (repeatable; adds to $NEMO_GYM_CALLBACK_ALLOWED_NETWORKS)",
    )
    parser.add_argument(
        "--callback-host",
        action="append",
        default=[],
        metavar="HOST",
        help="exact callback host name (repeatable; adds to $NEMO_GYM_CALLBACK_ALLOWED_HOSTS)",
    )
    parser.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"])
    parser.add_argument(
        "--state-dir",
        metavar="DIR",
        help="where the trial ledger lives (default: $RELAX_GYM_STATE_DIR, else "
        "$XDG_DATA_HOME/relax-gym/<environments> or ~/.local/share/relax-gym/<environments>: one per set "
        "of environments served); ':memory:' keeps trials in memory only",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="relax-gym", description="Trials between Relax and NeMo Gym environments."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="run the gateway (trial API and model-call bridge)")
    _add_gateway_options(serve)
    serve.add_argument(
        "--environments",
        metavar="FILE",
        help="environment specs as JSON (default: $NEMO_GYM_GATEWAY_ENVIRONMENTS_JSON)",
    )
    serve.set_defaults(run=_serve)
    up = commands.add_parser(
        "up", help="start the NeMo Gym servers of installed environments and a gateway in front of them"
    )
    up.add_argument(
        "environments", nargs="+", metavar="ENV", help="environment names (see `relax-gym plugins`)"
    )
    _add_gateway_options(up)
    up.add_argument("--max-concurrency", type=int, help="override every environment's max_concurrency")
    up.add_argument(
        "--replicas", type=int, default=1, metavar="N", help="independent copies of the servers (default 1)"
    )
    up.add_argument("--ray", metavar="ADDRESS", help="place the replicas on the Ray cluster at ADDRESS")
    up.add_argument(
        "--replica-resources",
        metavar="JSON",
        help="Ray resources per replica, e.g. '{\"CPU\": 2}' (with --ray)",
    )
    up.add_argument(
        "--nemo-gym-observability",
        action="store_true",
        help="run NeMo Gym with observability_enabled: true (NeMo Gym >= 0.5: its agents then prefix "
        "their model calls by rollout id, as the Relax integration runs it); also "
        "$RELAX_GYM_NEMO_GYM_OBSERVABILITY=1",
    )
    up.set_defaults(run=_up)
    plugins = commands.add_parser("plugins", help="list installed plugins and the environments they register")
    plugins.add_argument("--json", action="store_true", help="print one JSON document instead of tables")
    plugins.set_defaults(run=_plugins)
    new = commands.add_parser(
        "new", help="a new environment plugin that installs, is listed, probes green and passes the kit"
    )
    new.add_argument("name", metavar="NAME", help="the environment's name (also the package relax_gym_NAME)")
    new.add_argument(
        "--own-server",
        action="store_true",
        help="with a NeMo Gym resources server of its own (verify()), rows shipped with it, probes over them",
    )
    new.add_argument(
        "--dir",
        type=Path,
        metavar="DIR",
        help="where the plugin's directory NAME goes (default: ./plugins inside relax-gym's repository, "
        "else the current directory)",
    )
    new.set_defaults(run=_new)
    convert = commands.add_parser(
        "convert", help="convert a raw NeMo Gym JSONL dataset into a Relax one (input + metadata)"
    )
    convert.add_argument(
        "environment",
        metavar="ENV[:CONFIG]",
        help="registered environment whose plugin converts; rows are tagged with it and its config "
        "(default: its first)",
    )
    convert.add_argument("--input", required=True, metavar="RAW.jsonl", help="raw NeMo Gym rows")
    convert.add_argument(
        "--output", required=True, metavar="RELAX.jsonl", help="written atomically; never the input"
    )
    convert.add_argument("--limit", type=int, metavar="N", help="stop after N converted rows (N >= 1)")
    convert.set_defaults(run=_convert)
    mix = commands.add_parser(
        "mix", help="one training dataset from converted ones, each row tagged with its environment"
    )
    mix.add_argument(
        "sources",
        nargs="+",
        metavar="ENV[:CONFIG]=RELAX.jsonl",
        help="a converted file and where its rows go",
    )
    mix.add_argument("--output", required=True, metavar="MIXED.jsonl", help="written atomically")
    mix.add_argument("--seed", type=int, help="shuffle seed (same seed, same file; default 20260829)")
    mix.set_defaults(run=_mix)
    probe = commands.add_parser(
        "probe",
        help="score environments' verifier probes with their real servers (exit 1 on a mismatch or when "
        "nothing could be scored)",
    )
    probe.add_argument(
        "environment",
        metavar="ENV",
        nargs="+",
        help="registered environment(s) (see `relax-gym plugins`); several start in one server set",
    )
    probe.add_argument("--json", action="store_true", help="print one JSON document instead of a table")
    probe.add_argument(
        "--verifier-url",
        metavar="URL",
        help="score with the resources server already running at URL (e.g. a deployment's) instead of "
        "starting one",
    )
    probe.set_defaults(run=_probe)
    relax = commands.add_parser(
        "relax-args",
        help="the Relax flags that run these environments' trials, or what is wrong in a command line",
    )
    relax.add_argument("environments", nargs="+", metavar="ENV", help="environments the rows run in")
    relax.add_argument(
        "--gateway",
        metavar="URL",
        help="the gateway Relax's clients reach (default http://127.0.0.1:28100; with --check, where to look "
        "instead of the command's NEMO_GYM_URL)",
    )
    relax.add_argument(
        "--deadline-s",
        type=float,
        metavar="S",
        help="each trial's deadline (default: NEMO_GYM_DEADLINE_S, 1800)",
    )
    relax.add_argument(
        "--check",
        metavar="COMMAND",
        help="a Relax command line to check instead (exit 2 naming each problem)",
    )
    relax.set_defaults(run=_relax_args)
    _add_rollout(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    args.argv = argv
    logging.basicConfig(
        level=getattr(logging, str(getattr(args, "log_level", "warning")).upper(), logging.WARNING)
    )
    try:
        code: int = args.run(args)
    except RelaxGymError as exc:
        print(f"relax-gym: error: {exc}", file=sys.stderr)  # noqa: T201
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `relax-gym plugins | head`: the reader left; say nothing more, as cat does
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    return code


if __name__ == "__main__":
    sys.exit(main())
