"""The callback allowlist refuses every disguise of a host it does not list."""

from __future__ import annotations

import pytest

from relax_gym_core.bridge import CallbackPolicy, upstream_url
from relax_gym_core.errors import CallbackURLRejectedError, ConfigError


def policy(*networks: str, hosts: tuple[str, ...] = (), proxy: str | None = None) -> CallbackPolicy:
    return CallbackPolicy.parse(hosts=list(hosts), networks=list(networks), proxy=proxy)


LOOPBACK = policy("127.0.0.1/32")
IPV6_ONLY = policy("2001:db8::1/128")
TEN_ONE = policy("10.0.0.1/32")
NAMED = policy(hosts=("relax-head",))


@pytest.mark.parametrize(
    ("allow", "url"),
    [
        (TEN_ONE, "http://167772161/"),  # decimal form of 10.0.0.1
        (TEN_ONE, "http://012.0.0.1/"),  # octal first octet
        (TEN_ONE, "http://0xa.0.0.1/"),  # hex first octet
        (TEN_ONE, "http://0x0a000001/"),  # hex integer
        (TEN_ONE, "http://10.1/"),  # short form that resolvers expand
        (IPV6_ONLY, "http://[::ffff:10.0.0.1]/"),  # IPv4-mapped IPv6 of something else
        (TEN_ONE, "http://[::ffff:10.0.0.1]/"),  # ...and the reverse: mapped form of an allowed IPv4
        (LOOPBACK, "http://localhost/"),  # a name is not an address
        (LOOPBACK, "http://LocalHost:8000/"),  # mixed case changes nothing
        (NAMED, "http://relax-head./v1"),  # trailing dot
        (NAMED, "http://RELAX-HEAD.evil.com/"),  # suffix trick
        (LOOPBACK, "http://%31%32%37.0.0.1/"),  # percent-encoded host
        (LOOPBACK, "http://127.0.0.1@evil.example/"),  # @ trick: user info
        (LOOPBACK, "http://user:pw@127.0.0.1/"),  # credentials are user info too
        (LOOPBACK, "http://evil.example#@127.0.0.1/"),  # fragment trick
        (LOOPBACK, "http://127.0.0.1/v1#frag"),  # fragment
        (LOOPBACK, "http://127.0.0.1\\@evil.example/"),  # backslash trick
        (LOOPBACK, "http://127.0.0.1 /"),  # whitespace
        (LOOPBACK, "http://[fe80::1%25eth0]/"),  # zone id
        (LOOPBACK, "ftp://127.0.0.1/"),  # scheme
        (LOOPBACK, "http:///v1"),  # no host
        (LOOPBACK, "http://127.0.0.2/"),  # outside /32
        (LOOPBACK, "http://127.0.0.1:99999/"),  # bad port
    ],
)
def test_hostile_urls_are_refused(allow: CallbackPolicy, url: str) -> None:
    with pytest.raises(CallbackURLRejectedError) as excinfo:
        allow.canonical_base(url)
    assert "model_endpoint.base_url" in str(excinfo.value)


@pytest.mark.parametrize(
    ("allow", "url", "canonical"),
    [
        (LOOPBACK, "http://127.0.0.1:8000/agentic_api/", "http://127.0.0.1:8000/agentic_api"),
        (LOOPBACK, "HTTP://127.0.0.1/v1", "http://127.0.0.1/v1"),
        (policy("::1/128"), "http://[0:0::1]:9/x", "http://[::1]:9/x"),
        (policy("10.0.0.0/8"), "https://10.2.3.4/a?b=c", "https://10.2.3.4/a?b=c"),
        (NAMED, "http://Relax-Head:8000", "http://relax-head:8000"),
        (policy(hosts=("127.0.0.1",)), "http://127.0.0.1/", "http://127.0.0.1"),  # exact IP in the host list
    ],
)
def test_allowed_urls_are_rebuilt_from_checked_parts(allow: CallbackPolicy, url: str, canonical: str) -> None:
    assert allow.canonical_base(url) == canonical


def test_proxy_requires_https() -> None:
    proxied = policy("10.0.0.0/8", proxy="http://127.0.0.1:3128")
    with pytest.raises(CallbackURLRejectedError, match="https"):
        proxied.canonical_base("http://10.0.0.1/")
    assert proxied.canonical_base("https://10.0.0.1/") == "https://10.0.0.1"
    assert "3128" not in repr(proxied)


@pytest.mark.parametrize(
    ("hosts", "networks", "proxy", "needle"),
    [
        ([], [], None, "At least one"),
        (["*"], [], None, "Wildcard"),
        (["*.example"], [], None, "Wildcard"),
        ([], ["0.0.0.0/0"], None, "default-route"),
        ([], ["::/0"], None, "default-route"),
        ([], ["192.0.2.3/24"], None, "strict"),
        ([], ["nonsense"], None, "strict"),
        ([], ["10.0.0.0/8"], "http://u:p@127.0.0.1:3128", "user info"),
        ([], ["10.0.0.0/8"], "http://127.0.0.1:3128/path", "path"),
        ([], ["10.0.0.0/8"], "socks5://127.0.0.1:1080", "absolute http"),
        ([], ["10.0.0.0/8"], "http://[::1", "absolute http"),  # malformed: a ConfigError, not a ValueError
        ([], ["10.0.0.0/8"], "http://127.0.0.1:99999", "absolute http"),
    ],
)
def test_bad_allowlists_are_config_errors(
    hosts: list[str], networks: list[str], proxy: str | None, needle: str
) -> None:
    with pytest.raises(ConfigError, match=needle):
        CallbackPolicy.parse(hosts=hosts, networks=networks, proxy=proxy)


def test_environment_variables() -> None:
    env = {
        "NEMO_GYM_CALLBACK_ALLOWED_HOSTS": "Relax-Head, ",
        "NEMO_GYM_CALLBACK_ALLOWED_NETWORKS": "10.0.0.0/8",
    }
    loaded = CallbackPolicy.from_env(env, networks=["127.0.0.1/32"])
    assert loaded.hosts == frozenset({"relax-head"})
    assert [str(n) for n in loaded.networks] == ["10.0.0.0/8", "127.0.0.1/32"]


@pytest.mark.parametrize(
    ("base", "expected"),
    [
        ("http://h:1/agentic_api", "http://h:1/agentic_api/v1/responses"),
        ("http://h:1/v1", "http://h:1/v1/responses"),
        ("http://h:1", "http://h:1/v1/responses"),
        ("http://h:1/x?k=v", "http://h:1/x/v1/responses?k=v"),
    ],
)
def test_v1_suffix_rule(base: str, expected: str) -> None:
    assert upstream_url(base, "responses") == expected
