"""`relax-gym`: the command line. Each subcommand lives in its own small function."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from relax_gym_core.errors import ConfigError, RelaxGymError


def _serve(args: argparse.Namespace) -> int:
    from relax_gym_core.bridge import CallbackPolicy  # noqa: PLC0415
    from relax_gym_core.gateway import GatewaySettings, create_app, load_environments  # noqa: PLC0415
    from relax_gym_core.gateway.server import bind, run, url_of  # noqa: PLC0415

    environments = load_environments(args.environments)
    policy = CallbackPolicy.from_env(hosts=args.callback_host, networks=args.callback_network)
    try:
        sock = bind(args.host, args.port)
    except OSError as exc:
        raise ConfigError(f"cannot listen on {args.host}:{args.port}: {exc.strerror}") from None
    settings = GatewaySettings.from_env(environments, callback_policy=policy, public_url=url_of(sock))
    try:
        app = create_app(settings)
    except RelaxGymError:
        sock.close()
        raise
    run(app, sock, log_level=args.log_level)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="relax-gym", description="Trials between Relax and NeMo Gym environments."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="run the gateway (trial API and model-call bridge)")
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    serve.add_argument(
        "--port", type=int, default=28100, help="port to bind; 0 picks a free one (default 28100)"
    )
    serve.add_argument(
        "--environments",
        metavar="FILE",
        help="environment specs as JSON (default: $NEMO_GYM_GATEWAY_ENVIRONMENTS_JSON)",
    )
    serve.add_argument(
        "--callback-network",
        action="append",
        default=[],
        metavar="CIDR",
        help="callback network (repeatable; adds to $NEMO_GYM_CALLBACK_ALLOWED_NETWORKS)",
    )
    serve.add_argument(
        "--callback-host",
        action="append",
        default=[],
        metavar="HOST",
        help="exact callback host name (repeatable; adds to $NEMO_GYM_CALLBACK_ALLOWED_HOSTS)",
    )
    serve.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"])
    serve.set_defaults(run=_serve)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
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
    return code


if __name__ == "__main__":
    sys.exit(main())
