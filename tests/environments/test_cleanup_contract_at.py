"""CleanupContract.at: the usual contract, one route of one server for abort, force and probe."""

from __future__ import annotations

from relax_gym_core.plugin import CleanupContract
from relax_gym_core.plugin.cleanup import CleanupURLs

PATH = "/cleanup/{rollout_id}"


def test_at_names_one_path_for_abort_force_and_probe() -> None:
    contract = CleanupContract.at("resources", PATH)
    assert contract == CleanupContract(server="resources", abort_path=PATH, force_path=PATH, probe_path=PATH)
    assert not contract.stateless
    url = f"http://127.0.0.1:9000{PATH}"
    assert contract.resolve("http://127.0.0.1:9000/") == CleanupURLs(
        abort_url=url, force_cleanup_url=url, cleanup_probe_url=url
    )
