"""math_with_judge's resources server, where an answer math-verify did not decide fails /verify instead of
scoring 0.0 (runs in the NeMo Gym environment).

A subclass of the installed ``LibraryJudgeMathResourcesServer``; the checking stays upstream's. Upstream
checks each answer in a forked child bounded by ``library_verifier_timeout_seconds`` and, when it stops
that child at the bound or the child dies (crashed, OOM-killed), scores the answer 0.0, exactly like a
wrong one: a fake zero the trainer cannot tell from a real one. Here such a check raises instead:
/verify answers 503 naming what happened, the agent's /run fails, and so does the trial (Relax drops
the group).

Imports nothing from relax_gym_core: the NeMo Gym environment has no pluggy or cattrs.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from typing import Any

from fastapi import HTTPException
from resources_servers.math_with_judge.app import (
    LibraryJudgeMathResourcesServer,
    LibraryJudgeMathVerifyRequest,
    LibraryJudgeMathVerifyResponse,
)

LOG = logging.getLogger("relax_gym.gsm8k")
# judge.VERIFY_TIMEOUT_VAR, copied (judge.py needs relax_gym_core); test_gsm8k_undecided.py pins it.
TIMEOUT_VAR = "RELAX_GYM_MATH_VERIFY_TIMEOUT_S"


class UndecidedAnswerError(RuntimeError):
    """math-verify gave no verdict on an answer: its check outlived the bound, or its process died."""


class _ResultPipe:
    """Upstream's end of the child's result pipe, noting whether upstream read a verdict from it: upstream
    answers the child's verdict only after reading it, and 0.0 in every other case."""

    def __init__(self, connection: Any) -> None:
        self._connection = connection
        self.read = False

    def poll(self, *args: Any) -> bool:
        return bool(self._connection.poll(*args))

    def recv(self) -> Any:
        verdict = self._connection.recv()
        self.read = True
        return verdict

    def close(self) -> None:
        self._connection.close()


def _why(exitcode: int | None, elapsed_s: float, timeout_s: float) -> str:
    if elapsed_s >= timeout_s:  # upstream stops the child only at the bound
        return (
            f"math-verify's check did not finish within {timeout_s:g} s (library_verifier_timeout_seconds; "
            f"{TIMEOUT_VAR} raises it) and was stopped"
        )
    if exitcode is not None and exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        return f"math-verify's process was killed by {name} (exit code {exitcode}) before it gave a verdict"
    return f"math-verify's process exited with code {exitcode} before it gave a verdict"


class DecidedMathResourcesServer(LibraryJudgeMathResourcesServer):  # type: ignore[misc]
    """Upstream's math_with_judge resources server; an answer math-verify did not decide is an error."""

    @staticmethod
    async def _wait_for_library_verifier_process(
        process: Any, result_connection: Any, timeout_seconds: float
    ) -> tuple[float, str | None]:
        loop = asyncio.get_running_loop()
        started = loop.time()
        pipe = _ResultPipe(result_connection)
        upstream = LibraryJudgeMathResourcesServer._wait_for_library_verifier_process
        verdict: tuple[float, str | None] = await upstream(process, pipe, timeout_seconds)
        # exitcode 0 and a verdict read: the child finished and upstream's answer stands. Otherwise
        # upstream's 0.0 is no verdict (it also covers a child that exits right as upstream stops it).
        if process.exitcode == 0 and pipe.read:
            return verdict
        raise UndecidedAnswerError(_why(process.exitcode, loop.time() - started, timeout_seconds))

    async def verify(self, body: LibraryJudgeMathVerifyRequest) -> LibraryJudgeMathVerifyResponse:
        try:
            return await super().verify(body)
        except UndecidedAnswerError as exc:
            # An HTTPException: FastAPI answers it (503, {"detail": ...}) without upstream's traceback.
            LOG.error(  # noqa: TRY400 - the message says it all
                "%s /verify: %s; the answer is not scored", self.config.name, exc
            )
            raise HTTPException(status_code=503, detail=f"answer not scored: {exc}") from None
