"""`relax-gym-client`: the managed command Relax runs once per agentic session.

Reads RELAX_INPUT_JSON, runs the trial on the gateway at NEMO_GYM_URL, writes RELAX_OUTPUT_JSON.
Exit 0 only with an exported reward. Any failure prints one line `relax-gym-client: <message>` on
stderr, writes no output and exits 1 (Relax then drops the sampling group). SIGTERM/SIGINT abort the
remote trial and exit 128 + signal number.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import anyio

from relax_gym_core.client.exceptions import ClientConfigError, TrialCancelledError
from relax_gym_core.client.http import GatewayClient, httpx_transport
from relax_gym_core.client.output import build_output, write_output
from relax_gym_core.client.settings import ClientSettings
from relax_gym_core.client.trial import run_trial
from relax_gym_core.client.trial_request import build_create_request, read_session_input
from relax_gym_core.errors import RelaxGymError
from relax_gym_core.protocol import CreateTrialRequest, TrialSnapshot

PROG = "relax-gym-client"
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, description="Run one Relax agentic session as a trial on a relax-gym / NeMo Gym gateway."
    )
    parser.add_argument("--input-json", metavar="PATH", help="session input (default: $RELAX_INPUT_JSON)")
    parser.add_argument("--output-json", metavar="PATH", help="session output (default: $RELAX_OUTPUT_JSON)")
    return parser


async def _run_session(
    request: CreateTrialRequest, settings: ClientSettings
) -> tuple[TrialSnapshot, dict[str, Any] | None]:
    """Run the trial with SIGTERM/SIGINT wired to its stop event; a TrialCancelledError names the signal.
    Returns its terminal snapshot and its trajectory's counts (None when the gateway kept none)."""
    stop = anyio.Event()
    received: list[int] = []
    snapshot: TrialSnapshot | None = None
    counts: dict[str, Any] | None = None
    error: Exception | None = None
    with anyio.open_signal_receiver(*_STOP_SIGNALS) as signals:

        async def watch() -> None:
            async for signum in signals:
                received.append(signum)
                stop.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(watch)
            try:
                async with GatewayClient(
                    settings.gateway_url,
                    options=settings.options,
                    api_token=settings.api_token,
                    transport=httpx_transport(settings.options.max_connections),  # one trial: a few requests
                ) as client:
                    snapshot = await run_trial(request, client=client, stop=stop)
                    counts = await _counts(client, request.request_id)
            except Exception as exc:  # noqa: BLE001 - re-raised below, outside the task group
                error = exc
            finally:
                tg.cancel_scope.cancel()
    if error is not None:
        if isinstance(error, TrialCancelledError) and received:
            error.signum = received[0]
        raise error
    assert snapshot is not None
    return snapshot, counts


async def _counts(client: GatewayClient, request_id: str) -> dict[str, Any] | None:
    """The trial's trajectory counts; None when there are none to be had (the output is written anyway)."""
    try:
        document = await client.trajectory(request_id)
    except RelaxGymError:
        return None
    counts = document.get("counts") if document is not None else None
    return counts if isinstance(counts, dict) else None


def _path(explicit: str | None, environ: Mapping[str, str], name: str, flag: str) -> str:
    value = explicit or environ.get(name)
    if not value:
        raise ClientConfigError(f"{name} must be set by Relax (or pass {flag})")
    return value


def run(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    environ = os.environ if environ is None else environ
    try:
        input_path = _path(args.input_json, environ, "RELAX_INPUT_JSON", "--input-json")
        output_path = _path(args.output_json, environ, "RELAX_OUTPUT_JSON", "--output-json")
        settings = ClientSettings.from_env(environ)
        request = build_create_request(read_session_input(input_path), settings)
        snapshot, counts = anyio.run(_run_session, request, settings)
        if not write_output(output_path, build_output(snapshot, counts)):
            # Still exit 0: Relax removes the directory when it cancels a session, and expects no result.
            _say(
                "RELAX_OUTPUT_JSON's directory no longer exists (Relax removes it when it cancels a "
                "session); the trial's result was not written"
            )
    except TrialCancelledError as exc:
        _say(str(exc))
        return 128 + exc.signum if exc.signum else 1
    except KeyboardInterrupt:  # SIGINT before the handlers were installed
        _say("Managed session cancelled (interrupted before the trial started)")
        return 128 + signal.SIGINT
    except (RelaxGymError, ValueError, OSError) as exc:
        _say(str(exc))
        return 1
    except Exception as exc:  # noqa: BLE001 - a bug still ends as one line and exit 1, never a traceback
        _say(f"internal error ({type(exc).__name__}: {exc})")
        return 1
    return 0


def _say(message: str) -> None:
    # One line: Relax shows only a tail of command.log.
    print(f"{PROG}: {' '.join(message.split())}", file=sys.stderr, flush=True)  # noqa: T201


def main() -> int:
    return run()


if __name__ == "__main__":
    sys.exit(main())
