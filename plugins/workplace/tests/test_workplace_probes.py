"""How verifier probes are derived from a row's ground truth (their rewards are checked against the real
verifier in test_workplace_server.py)."""

from __future__ import annotations

import copy
import json
from typing import Any

from relax_gym_core.plugin import VerifierProbe
from relax_gym_core.testing import Hooks

from relax_gym_workplace.probes import probes_for_row

ENV = "workplace_assistant"
KINDS = {"ground_truth": 1.0, "no_calls": 0.0, "missing_write": 0.0, "wrong_id": 0.0, "extra_write": 0.0}


def _calls(probe: VerifierProbe) -> list[dict[str, str]]:
    return [
        {"name": item["name"], "arguments": item["arguments"]}
        for item in probe.output
        if item["type"] == "function_call"
    ]


def _by_kind(row: dict[str, Any]) -> dict[str, VerifierProbe]:
    return {probe.name.split(":", 1)[1]: probe for probe in probes_for_row(row)}


def test_every_example_row_gets_every_kind_of_probe(hooks: Hooks, rows: list[dict[str, Any]]) -> None:
    probes = list(hooks.environments.get(ENV).verifier_probes())
    assert [probe.name for probe in probes] == [f"{row['id']}:{kind}" for row in rows for kind in KINDS]
    for probe in probes:
        assert probe.expected_reward == KINDS[probe.name.split(":", 1)[1]]


def test_probe_outputs_are_model_answers(rows: list[dict[str, Any]]) -> None:
    for row in rows:
        for probe in probes_for_row(row):
            *calls, message = probe.output
            assert message["type"] == "message"
            assert message["role"] == "assistant"
            assert message["status"] == "completed"
            assert [part["type"] for part in message["content"]] == ["output_text"]
            for item in calls:
                assert item["type"] == "function_call"
                assert set(item) == {"type", "name", "arguments", "call_id", "id", "status"}
                assert item["status"] == "completed"
                assert isinstance(json.loads(item["arguments"]), dict)
            assert len({item["call_id"] for item in calls}) == len(calls)
            assert len({item["id"] for item in probe.output}) == len(probe.output)


def test_probes_mutate_the_rows_own_ground_truth(rows: list[dict[str, Any]]) -> None:
    for row in rows:
        truth = row["ground_truth"]
        probes = _by_kind(row)
        assert _calls(probes["ground_truth"]) == truth
        assert _calls(probes["no_calls"]) == []
        assert _calls(probes["missing_write"]) == truth[:-1]
        wrong = _calls(probes["wrong_id"])
        changed = [(a, b) for a, b in zip(truth, wrong, strict=True) if a != b]
        assert len(changed) == 1
        before, after = (json.loads(call["arguments"]) for call in changed[0])
        assert {key for key in before if before[key] != after[key]} <= {
            k for k in before if k.endswith("_id")
        }
        extra = _calls(probes["extra_write"])
        assert extra[:-1] == truth
        assert extra[-1]["name"] == truth[-1]["name"]


def test_extra_write_duplicates_a_creating_call_and_retargets_a_repeatable_one(
    rows: list[dict[str, Any]],
) -> None:
    reply = rows[0]  # ends with email_reply_email: a second reply is a second email
    assert _calls(_by_kind(reply)["extra_write"])[-1] == reply["ground_truth"][-1]
    deletes = rows[3]  # ends with a delete: deleting twice changes nothing, so delete another customer
    extra = json.loads(_calls(_by_kind(deletes)["extra_write"])[-1]["arguments"])["customer_id"]
    used = {json.loads(call["arguments"])["customer_id"] for call in deletes["ground_truth"]}
    assert extra not in used
    assert len(extra) == 8
    assert extra.isdigit()


def test_reads_are_never_the_missing_write(rows: list[dict[str, Any]]) -> None:
    row = copy.deepcopy(rows[0])
    read = {"name": "email_search_emails", "arguments": json.dumps({"query": "Carlos"})}
    row["ground_truth"] = [*row["ground_truth"], read]
    assert _calls(_by_kind(row)["missing_write"]) == [read]


def test_a_read_only_ground_truth_only_gets_the_replay_probe(rows: list[dict[str, Any]]) -> None:
    row = copy.deepcopy(rows[0])
    row["ground_truth"] = [{"name": "email_search_emails", "arguments": json.dumps({"query": "Carlos"})}]
    assert list(_by_kind(row)) == ["ground_truth"]


def test_probe_rows_carry_the_list_form_of_ground_truth(rows: list[dict[str, Any]]) -> None:
    row = copy.deepcopy(rows[1])
    row["ground_truth"] = json.dumps(row["ground_truth"])
    for probe in probes_for_row(row):
        assert probe.row["ground_truth"] == rows[1]["ground_truth"]
