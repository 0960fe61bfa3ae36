"""Which callback URLs the bridge may call: exact host names or strict CIDR networks, nothing else.

Hosts are never resolved for CIDR matching, and the URL the bridge finally calls is rebuilt from the
validated parts, so an HTTP client that parses a URL differently cannot be steered elsewhere.
"""

from __future__ import annotations

import functools
import ipaddress
import os
import re
from collections.abc import Mapping, Sequence

from attrs import field, frozen

from relax_gym_core.errors import CallbackURLRejectedError, ConfigError
from relax_gym_core.protocol.types import split_http_url

HOSTS_VAR = "NEMO_GYM_CALLBACK_ALLOWED_HOSTS"
NETWORKS_VAR = "NEMO_GYM_CALLBACK_ALLOWED_NETWORKS"
PROXY_VAR = "NEMO_GYM_CALLBACK_PROXY"

type Network = ipaddress.IPv4Network | ipaddress.IPv6Network

# A plain DNS name: labels of letters, digits and hyphens. Anything else (percent signs, backslashes,
# trailing dots, integers-as-addresses) is not a name we will ever connect to.
_HOSTNAME_RE = re.compile(r"(?!-)[a-z0-9-]{1,63}(?<!-)(\.(?!-)[a-z0-9-]{1,63}(?<!-))*")
_FORBIDDEN_CHARS = re.compile(r"[\x00-\x20\x7f\\]")


def _parse_network(text: str, source: str) -> Network:
    try:
        network = ipaddress.ip_network(text, strict=True)
    except ValueError as exc:
        raise ConfigError(f"{source}: {text!r} is not a strict CIDR network ({exc})") from None
    if network.prefixlen == 0:
        raise ConfigError(f"{source}: {text!r} must not contain a default-route network")
    return network


def _ip_literal(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.scope_id:
        return None
    return address


@frozen(kw_only=True, cache_hash=True)  # hashed on every model call (the cache of canonical_base)
class CallbackPolicy:
    """The callback allowlist (and the optional explicit proxy, which forces https)."""

    hosts: frozenset[str] = frozenset()
    networks: tuple[Network, ...] = ()
    proxy: str | None = field(default=None, repr=False)

    @classmethod
    def parse(
        cls, *, hosts: Sequence[str], networks: Sequence[str], proxy: str | None, source: str = ""
    ) -> CallbackPolicy:
        clean_hosts = frozenset(h.strip().lower() for h in hosts if h.strip())
        if "*" in clean_hosts or any("*" in h for h in clean_hosts):
            raise ConfigError(f"{source or HOSTS_VAR}: Wildcard callback hosts are not supported")
        nets = tuple(_parse_network(n.strip(), source or NETWORKS_VAR) for n in networks if n.strip())
        if not clean_hosts and not nets:
            raise ConfigError(
                "At least one exact callback hostname or CIDR network must be configured "
                f"({HOSTS_VAR} / {NETWORKS_VAR}, or --callback-host / --callback-network)"
            )
        if proxy:
            parts = split_http_url(proxy)
            if parts is None:
                raise ConfigError(f"{PROXY_VAR} must be an absolute http(s) URL")
            if (
                parts.username
                or parts.password
                or parts.path not in ("", "/")
                or parts.query
                or parts.fragment
            ):
                raise ConfigError(f"{PROXY_VAR} must not contain user info, a path, a query or a fragment")
        return cls(hosts=clean_hosts, networks=nets, proxy=proxy or None)

    @classmethod
    def from_env(
        cls,
        environ: Mapping[str, str] = os.environ,
        *,
        hosts: Sequence[str] = (),
        networks: Sequence[str] = (),
    ) -> CallbackPolicy:
        return cls.parse(
            hosts=[*environ.get(HOSTS_VAR, "").split(","), *hosts],
            networks=[*environ.get(NETWORKS_VAR, "").split(","), *networks],
            proxy=environ.get(PROXY_VAR) or None,
        )

    def allows_host(self, host: str) -> bool:
        if host in self.hosts:
            return True
        address = _ip_literal(host)
        return address is not None and any(
            address.version == net.version and address in net for net in self.networks
        )

    def canonical_base(self, base_url: str) -> str:
        """Validate a callback base URL; return it rebuilt from its checked parts (no trailing '/').

        Cached: every model call of a trial asks again with the same URL.
        """
        return _canonical_base(self, base_url)

    def _check_and_rebuild(self, base_url: str) -> str:
        problem = "model_endpoint.base_url"
        if _FORBIDDEN_CHARS.search(base_url):
            raise CallbackURLRejectedError(f"{problem} host is not in the callback allowlist")
        parts = split_http_url(base_url)
        if parts is None:
            raise CallbackURLRejectedError(f"{problem} must be an absolute http(s) URL")
        if self.proxy and parts.scheme != "https":
            raise CallbackURLRejectedError(f"{problem} must use https when the callback proxy is enabled")
        if "@" in parts.netloc:
            raise CallbackURLRejectedError(f"{problem} must not contain user info")
        if parts.fragment or base_url.endswith("#"):
            raise CallbackURLRejectedError(f"{problem} must not contain a fragment")
        host = parts.hostname or ""  # never empty: split_http_url requires a host
        address = _ip_literal(host)
        if address is None and not _HOSTNAME_RE.fullmatch(host):
            raise CallbackURLRejectedError(f"{problem} host is not in the callback allowlist")
        if not self.allows_host(host):
            raise CallbackURLRejectedError(f"{problem} host is not in the callback allowlist")
        port = parts.port
        shown_host = f"[{address.compressed}]" if isinstance(address, ipaddress.IPv6Address) else host
        netloc = shown_host if port is None else f"{shown_host}:{port}"
        query = f"?{parts.query}" if parts.query else ""
        return f"{parts.scheme}://{netloc}{parts.path.rstrip('/')}{query}"

    def check(self, base_url: str) -> None:
        self.canonical_base(base_url)


@functools.lru_cache(maxsize=16384)
def _canonical_base(policy: CallbackPolicy, base_url: str) -> str:
    return policy._check_and_rebuild(base_url)


def upstream_url(canonical_base: str, resource: str) -> str:
    """Reference /v1 suffix rule: '<base>/<resource>' if the base ends in /v1, else '<base>/v1/<resource>'."""
    base, _, query = canonical_base.partition("?")
    path = f"{base}/{resource}" if base.endswith("/v1") else f"{base}/v1/{resource}"
    return f"{path}?{query}" if query else path
