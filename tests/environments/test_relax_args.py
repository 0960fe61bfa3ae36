"""`relax-gym relax-args`: the Relax flags for a set of environments, and what is wrong in a Relax command
line (checked against a real gateway process), as a user runs the command."""

from __future__ import annotations

import shlex

import pytest

from relax_gym_core.gym.ports import free_ports
from relax_gym_core.testing.processes import run_cli, start_gateway

pytest.importorskip("relax_gym_workplace")
pytest.importorskip("relax_gym_reasoning_gym_cc")

ECHO = {"echo": {"environment": "echo", "runtime": "echo", "max_concurrency": 2, "queue_capacity": 2}}
TRAIN = "python -m relax.entrypoints.train --hf-checkpoint /models/policy"


def agent_env(text: str) -> dict[str, str]:
    flags = "\n".join(line for line in text.splitlines() if not line.startswith("#"))  # the notes
    tokens = shlex.split(flags.replace("\\\n", " "))
    start = tokens.index("--agent-env") + 1
    pairs = []
    for token in tokens[start:]:
        if token.startswith("--"):
            break
        pairs.append(token)
    return dict(pair.split("=", 1) for pair in pairs)


def test_one_environment_with_tools_gets_its_config_a_timeout_above_the_deadline_and_a_parser() -> None:
    done = run_cli(
        "relax-args", "workplace_assistant", "--gateway", "http://10.0.0.5:28100", "--deadline-s", "600"
    )
    assert done.returncode == 0, done.stderr
    text = done.stdout
    assert "--use-agentic-rollout --agent-command relax-gym-client" in text
    assert "--agent-timeout 660" in text  # above the deadline by the client's margin
    assert agent_env(text) == {
        "NEMO_GYM_URL": "http://10.0.0.5:28100",
        "NEMO_GYM_ENVIRONMENT": "workplace_assistant",
        "NEMO_GYM_CONFIG": "workplace-assistant-v1",
        "NEMO_GYM_DEADLINE_S": "600",
        "NEMO_GYM_LEASE_S": "60",
    }
    assert not [key for key in agent_env(text) if key.startswith("RELAX_")]
    assert "--agentic-tool-call-parser PARSER" in text  # its rows offer the model tools
    assert "/v1/responses route" in text


def test_a_single_turn_environment_needs_no_parser_and_a_mix_names_no_environment() -> None:
    mcqa = run_cli("relax-args", "mcqa")
    assert mcqa.returncode == 0 and "--agentic-tool-call-parser" not in mcqa.stdout
    assert agent_env(mcqa.stdout)["NEMO_GYM_URL"] == "http://127.0.0.1:28100"  # serve/up's default address
    # Claude Code brings tools of its own and speaks Messages: a mix with it needs both routes and a parser.
    mix = run_cli("relax-args", "mcqa", "reasoning_gym")
    assert mix.returncode == 0
    assert "NEMO_GYM_ENVIRONMENT" not in agent_env(mix.stdout) and "NEMO_GYM_CONFIG" not in agent_env(
        mix.stdout
    )
    assert "--agentic-tool-call-parser PARSER" in mix.stdout
    assert "/v1/messages and /v1/responses routes" in mix.stdout
    assert "each row names its own" in mix.stdout


def test_the_printed_flags_pass_the_check_against_the_running_gateway() -> None:
    with start_gateway(ECHO) as gateway:
        printed = run_cli("relax-args", "workplace_assistant", "--gateway", gateway.url).stdout
        flags = "\n".join(line for line in printed.splitlines() if not line.startswith("#"))
        command = f"{TRAIN} {flags.replace('PARSER', 'qwen3_coder')}"
        done = run_cli("relax-args", "workplace_assistant", "--check", command)
    assert done.returncode == 0, done.stderr
    assert "runs these environments' trials" in done.stdout


def test_each_problem_of_a_command_line_is_named_and_it_exits_2() -> None:
    (closed,) = free_ports(1)
    command = (
        f"{TRAIN} --use-agentic-rollout --agent-command relax-gym-client --agent-timeout 600 "
        f"--agent-env NEMO_GYM_URL=http://127.0.0.1:{closed} NEMO_GYM_ENVIRONMENT=mcqa "
        "NEMO_GYM_DEADLINE_S=600 RELAX_SESSION_ID=x"
    )
    done = run_cli("relax-args", "workplace_assistant", "--check", command)
    assert done.returncode == 2
    problems = done.stderr.splitlines()
    assert all(line.startswith("relax-gym relax-args: ") for line in problems)
    text = done.stderr
    assert "--agent-env RELAX_SESSION_ID: Relax refuses RELAX_* keys" in text
    assert "--agent-timeout 600 is not above the trial's deadline (600 s)" in text and "(give 660)" in text
    assert "--agentic-tool-call-parser is missing" in text
    assert "NEMO_GYM_ENVIRONMENT=mcqa is not one of workplace_assistant" in text
    assert f"the gateway at http://127.0.0.1:{closed} does not answer GET /readyz" in text
    assert len(problems) == 5 and "Traceback" not in text
    # Relax keeps only the last --agent-env, and without --use-agentic-rollout launches no agent at all.
    twice = run_cli("relax-args", "mcqa", "--check", f"{TRAIN} --agent-env A=1 --agent-env B=2")
    assert twice.returncode == 2
    assert "--use-agentic-rollout is missing" in twice.stderr
    assert "--agent-env is given 2 times" in twice.stderr
    assert "--agent-command does not run relax-gym-client" in twice.stderr
    assert "no gateway: NEMO_GYM_URL is not in --agent-env" in twice.stderr


def test_an_unknown_environment_or_a_broken_command_line_is_one_clear_line() -> None:
    unknown = run_cli("relax-args", "no_such_env")
    assert (
        unknown.returncode == 2 and "no installed plugin provides environment 'no_such_env'" in unknown.stderr
    )
    broken = run_cli("relax-args", "mcqa", "--check", "train --agent-env 'NEMO_GYM_URL=x")
    assert broken.returncode == 2
    assert "--check: the command line cannot be split as a shell would" in broken.stderr
    assert "Traceback" not in unknown.stderr + broken.stderr
