"""How an environment's runs are released and proven released: a plugin's contract, and the URLs the
runtimes read once `relax-gym up` knows where the servers listen."""

from __future__ import annotations

from attrs import frozen


@frozen(kw_only=True)
class CleanupURLs:
    """A run's cleanup endpoints as the runtimes read them: full URLs, each with "{rollout_id}".

    stateless=True means nothing is left once the /run call is closed: cleanup is confirmed without
    calls. Otherwise abort and force cleanup are POSTed and the probe is a GET answering
    {"clean": true} when nothing is left. Field names are the environments file's keys.
    """

    stateless: bool = False
    abort_url: str | None = None
    force_cleanup_url: str | None = None
    cleanup_probe_url: str | None = None


@frozen(kw_only=True)
class CleanupContract:
    """How a plugin's runs are released and proven released: paths on one of its servers.

    `relax-gym up` resolves it against the server's address (resolve()) into the CleanupURLs the
    runtime reads: the one translation between the two.
    """

    stateless: bool = False
    server: str | None = None
    abort_path: str | None = None
    force_path: str | None = None
    probe_path: str | None = None

    @classmethod
    def at(cls, server: str, path: str) -> CleanupContract:
        """The usual contract: one route of `server` (with "{rollout_id}") that POST releases (abort and
        force alike) and GET probes (relax_gym_core.ingym.CLEANUP_PATH is the one the shipped servers use)."""
        return cls(server=server, abort_path=path, force_path=path, probe_path=path)

    def resolve(self, base_url: str | None) -> CleanupURLs:
        """The URLs of this contract on a server at `base_url` (None when the contract names none)."""
        if self.stateless:
            return CleanupURLs(stateless=True)

        def url(path: str | None) -> str | None:
            return f"{base_url.rstrip('/')}{path}" if base_url is not None and path is not None else None

        return CleanupURLs(
            abort_url=url(self.abort_path),
            force_cleanup_url=url(self.force_path),
            cleanup_probe_url=url(self.probe_path),
        )


STATELESS = CleanupContract(stateless=True)  # nothing outlives the /run call: confirmed without a call
