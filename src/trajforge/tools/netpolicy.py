"""Where the host may fetch on a model's behalf: the network policy and the one URL gate.

A model chooses the URLs that ``web_extract``, ``vision_analyze`` and the browser open, and a page
or a search result chooses redirects and subresources. Those fetches run in the host process,
inside the operator's network, so without a policy a model (or a page it reads) could reach the
cloud metadata service, the operator's router, a database on loopback: server-side request
forgery.

:class:`NetPolicy` denies, unless explicitly allowed, every address that is not a public unicast
address: loopback, private (RFC 1918, unique-local), link-local (which holds the metadata service
169.254.169.254), carrier-grade NAT, multicast, reserved and documentation ranges, and the IPv6
forms that embed such an IPv4 address (mapped, compatible, 6to4, NAT64).

Why a *gate* and not a check: a URL has many spellings of one host (``１２７．０．０．１``,
``①②⑦.⓪.⓪.①``, ``0x7f.1``, ``2130706433``, ``[::ffff:7f00:1]``, ``%31%32%37.0.0.1``...) and
URL parsers disagree on them. A policy that reads one spelling while the HTTP client connects to
another is no policy. So the gate does not check a string: :meth:`NetPolicy.gate` *parses* the
URL into the :class:`Target` the client is then handed, unchanged. Its host is already in the
form the client connects to (IDNA/UTS 46 applied by yarl, as aiohttp does; percent-encoding
decoded and IPv4 numbers read as a browser reads them; an IP literal rewritten to its one
canonical text), and that is the form checked. Three layers then hold at connect time
(:class:`GatedConnector`, built only by :mod:`~trajforge.tools.web_fetch`):

1. the resolver is handed only the gated host name, resolves it once, and returns only the
   addresses the policy allows (no second lookup, so no DNS rebinding);
2. every socket, IP literals included (aiohttp never sends those to a resolver), is created by a
   factory that checks the address it is about to connect to against the policy *and* against
   what this very request was gated to (the literal, or the addresses its resolution returned);
3. a connection made outside a gated request is refused outright.
"""

from __future__ import annotations

import asyncio
import contextvars
import ipaddress
import re
import socket
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Final
from urllib.parse import unquote_to_bytes, urljoin

from aiohttp.abc import AbstractResolver, ResolveResult
from pydantic import BaseModel, ConfigDict, Field, field_validator
from yarl import URL

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

Resolve = Callable[[str, int], Awaitable[list[IPAddress]]]
"""``(host, port) -> addresses``: how a gated fetch resolves a name (every address it has, not
yet checked). :func:`system_resolve` unless a test injects a hosts-like table."""


def _nets(*pairs: tuple[str, str]) -> tuple[tuple[IPNetwork, str], ...]:
    return tuple((ipaddress.ip_network(cidr), why) for cidr, why in pairs)


# Every range that is not public unicast, with the words an error uses for it.
DEFAULT_DENIED: Final = _nets(
    ("0.0.0.0/8", "'this network' (unspecified)"),
    ("10.0.0.0/8", "private (RFC 1918)"),
    ("100.64.0.0/10", "carrier-grade NAT (shared)"),
    ("127.0.0.0/8", "loopback"),
    ("169.254.0.0/16", "link-local (cloud metadata service)"),
    ("172.16.0.0/12", "private (RFC 1918)"),
    ("192.0.0.0/24", "IETF protocol assignments"),
    ("192.0.2.0/24", "documentation (TEST-NET-1)"),
    ("192.88.99.0/24", "6to4 relay anycast"),
    ("192.168.0.0/16", "private (RFC 1918)"),
    ("198.18.0.0/15", "benchmarking"),
    ("198.51.100.0/24", "documentation (TEST-NET-2)"),
    ("203.0.113.0/24", "documentation (TEST-NET-3)"),
    ("224.0.0.0/4", "multicast"),
    ("240.0.0.0/4", "reserved (and broadcast)"),
    ("::/128", "unspecified"),
    ("::1/128", "loopback"),
    ("::/96", "IPv4-compatible (deprecated)"),
    ("64:ff9b:1::/48", "local-use NAT64"),
    ("100::/64", "discard-only"),
    ("2001::/32", "Teredo"),
    ("2001:db8::/32", "documentation"),
    ("fc00::/7", "unique-local (private)"),
    ("fe80::/10", "link-local"),
    ("fec0::/10", "site-local (deprecated private)"),
    ("ff00::/8", "multicast"),
)

_NAT64: Final = ipaddress.ip_network("64:ff9b::/96")
_COMPAT: Final = ipaddress.ip_network("::/96")
_SCHEMES: Final = frozenset({"http", "https"})
_DEFAULT_PORTS: Final = {"http": 80, "https": 443}
# What a host name may hold once IDNA has made it ASCII (underscores occur in real names).
_NAME: Final = re.compile(r"[a-z0-9_-]+(\.[a-z0-9_-]+)*")
_SCHEME_PREFIX: Final = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*):[/\\]*")


class NetPolicyError(Exception):
    """A fetch the policy refuses; the message names the URL, the address, why, and how to allow it.

    Deliberately not an ``OSError``: aiohttp would wrap that into a generic connection error and
    lose the reason (the connect-time check raises :class:`ConnectRefused`, which is one, and the
    fetcher turns it back into this).
    """


class ConnectRefused(OSError):
    """The connect-time check refused a socket's address (raised inside aiohttp's connect)."""


def _unembed(ip: IPAddress) -> IPAddress:
    """The IPv4 address an IPv6 address carries (mapped, compatible, 6to4, NAT64), else itself."""
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return ip.ipv4_mapped
        if ip.sixtofour is not None:
            return ip.sixtofour
        if ip in _NAT64 or (ip in _COMPAT and int(ip) > 1):  # :: and ::1 are not IPv4 in disguise
            return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return ip


def _in(addr: IPAddress, net: IPNetwork) -> bool:
    return addr.version == net.version and addr in net


def _host_matches(host: str, patterns: Sequence[str]) -> bool:
    """``example.com`` matches itself; ``*.example.com`` matches its subdomains (not itself)."""
    for pattern in patterns:
        if pattern.startswith("*."):
            if host.endswith(pattern[1:]):
                return True
        elif host == pattern:
            return True
    return False


# -- the URL as the client will fetch it ----------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """A URL after the gate: what the HTTP client is handed, and what was checked about it.

    ``url.raw_host == host`` always: the client connects to (or resolves) exactly ``host``.
    """

    url: URL  # the request URL: canonical host, no fragment
    host: str  # a lower-case ASCII name without a trailing dot, or an IP literal's canonical text
    port: int
    address: IPAddress | None  # the host is an IP literal (in whatever spelling it was written)


def _ipv4_number(part: str) -> int | None:
    """One part of a browser's IPv4 parse: decimal, ``0x`` hex or ``0`` octal; None if not one."""
    radix = 10
    if part[:2].lower() == "0x":
        part, radix = part[2:], 16
    elif len(part) > 1 and part[0] == "0":
        part, radix = part[1:], 8
    if not part:
        return 0
    try:
        return int(part, radix) if part.isascii() and part.isalnum() else None
    except ValueError:
        return None


def _ends_in_number(host: str) -> bool:
    """The WHATWG URL standard's test: a host whose last label is a number must be IPv4."""
    parts = host.split(".")
    if parts[-1] == "" and len(parts) > 1:
        parts.pop()
    last = parts[-1]
    if not last.isascii():
        return False
    return last.isdigit() or (last[:2].lower() == "0x" and _ipv4_number(last) is not None)


def _parse_ipv4(host: str) -> ipaddress.IPv4Address | None:
    """The WHATWG IPv4 parser (what browsers and ``inet_aton`` accept: ``127.1``, ``0x7f.1``,
    ``0177.0.0.1``, ``2130706433``); None where it fails."""
    parts = host.split(".")
    if parts[-1] == "" and len(parts) > 1:
        parts.pop()
    if not 1 <= len(parts) <= 4 or any(p == "" for p in parts):
        return None
    numbers = [_ipv4_number(p) for p in parts]
    if any(n is None for n in numbers):
        return None
    nums = [n for n in numbers if n is not None]
    if any(n > 255 for n in nums[:-1]) or nums[-1] >= 256 ** (5 - len(nums)):
        return None
    value = nums[-1] + sum(n * 256 ** (3 - i) for i, n in enumerate(nums[:-1]))
    return ipaddress.IPv4Address(value)


def _prepare(raw: str) -> str:
    """The URL string as a browser reads it before parsing: surrounding C0 controls and spaces
    trimmed, tabs and newlines removed, and (http and https being "special" schemes) any run of
    slashes or backslashes after the scheme, and every backslash before the query, read as ``/``."""
    text = raw.strip(
        "\x00\x01\x02\x03\x04\x05\x06\x07\x08\t\n\x0b\x0c\r\x0e\x0f\x10\x11\x12\x13"
        "\x14\x15\x16\x17\x18\x19\x1a\x1b\x1c\x1d\x1e\x1f "
    )
    text = text.replace("\t", "").replace("\n", "").replace("\r", "")
    match = _SCHEME_PREFIX.match(text)
    if match is None or match.group(1).lower() not in _SCHEMES:
        return text
    rest = text[match.end() :]
    cut = min((i for i in (rest.find("?"), rest.find("#")) if i >= 0), default=len(rest))
    return f"{match.group(1)}://" + rest[:cut].replace("\\", "/") + rest[cut:]


def _canonical_host(raw_host: str, shown: str) -> tuple[str, IPAddress | None]:
    """``(host, address)`` for a yarl ``raw_host``: the IPv6/IPv4 literal in canonical text, or
    the ASCII name without its trailing dot. Raises :class:`NetPolicyError`."""
    host = raw_host.lower()
    if ":" in host:  # only an IPv6 literal has one here (yarl took the port off)
        text, _, zone = host.partition("%")
        try:
            addr6 = ipaddress.IPv6Address(text)
        except ValueError:
            raise NetPolicyError(f"refused {shown!r}: {host!r} is not a valid IPv6 address") from None
        if zone:
            raise NetPolicyError(f"refused {shown!r}: IPv6 zone identifiers ({zone!r}) are not fetched")
        return str(addr6), addr6
    if "%" in host:  # browsers percent-decode a host, then map it again: so does the gate
        try:
            decoded = unquote_to_bytes(host).decode("utf-8")
            again = URL.build(scheme="http", host=decoded).raw_host or ""
        except (UnicodeDecodeError, ValueError):
            raise NetPolicyError(f"refused {shown!r}: the host is not valid percent-encoded UTF-8") from None
        if "%" in again or ":" in again:
            raise NetPolicyError(f"refused {shown!r}: the host {host!r} is encoded more than once")
        host = again.lower()
    name = host[:-1] if host.endswith(".") else host
    if _ends_in_number(name):
        addr4 = _parse_ipv4(name)
        if addr4 is None:
            raise NetPolicyError(f"refused {shown!r}: {host!r} is not a valid IPv4 address")
        return str(addr4), addr4
    if not _NAME.fullmatch(name) or len(name) > 253:
        raise NetPolicyError(f"refused {shown!r}: {host!r} is not a valid host name")
    return name, None


def canonical_target(url: str | URL) -> Target:
    """Parse ``url`` exactly once, into the :class:`Target` an HTTP client is handed.

    Raises :class:`NetPolicyError` for what is not an absolute http(s) URL with a valid host.
    Policy-free: :meth:`NetPolicy.gate` adds the checks.
    """
    shown = str(url)[:300]
    try:
        parsed = url if isinstance(url, URL) else URL(_prepare(url))
        scheme = parsed.scheme.lower()
        raw_host = parsed.raw_host
        port = parsed.port
    except (ValueError, TypeError) as exc:
        raise NetPolicyError(f"refused {shown!r}: not a valid URL ({exc})") from None
    if scheme not in _SCHEMES:
        raise NetPolicyError(
            f"refused {shown!r}: only http and https URLs may be fetched, not {scheme or 'no scheme'!r}"
        )
    if not raw_host:
        raise NetPolicyError(f"refused {shown!r}: the URL has no host")
    host, address = _canonical_host(raw_host, shown)
    port = port or _DEFAULT_PORTS[scheme]
    try:
        canonical = parsed.with_scheme(scheme).with_host(host).with_fragment(None)
    except ValueError as exc:
        raise NetPolicyError(f"refused {shown!r}: not a valid URL ({exc})") from None
    if canonical.raw_host != host or canonical.port != port:  # the invariant every check relies on
        raise NetPolicyError(f"refused {shown!r}: its host cannot be written unambiguously")
    return Target(url=canonical, host=host, port=port, address=address)


def join_location(base: URL | str, location: str) -> str:
    """Where a redirect's ``Location`` leads from ``base``, read as a browser reads it (a
    backslash before the query is a slash: ``/\\\\host`` is another host, not a path)."""
    cut = min((i for i in (location.find("?"), location.find("#")) if i >= 0), default=len(location))
    location = location[:cut].replace("\\", "/") + location[cut:]
    return urljoin(str(base), location)


# -- the policy -----------------------------------------------------------------------------------


async def system_resolve(host: str, port: int) -> list[IPAddress]:
    """Every address the system resolver gives ``host`` (deduplicated, in its order)."""
    loop = asyncio.get_running_loop()
    try:
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise OSError(f"could not resolve host {host!r}: {exc.strerror}") from None
    out: list[IPAddress] = []
    for _family, _type, _proto, _canon, sockaddr in infos:
        addr = ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0])
        if addr not in out:
            out.append(addr)
    return out


class NetPolicy(BaseModel):
    """Which hosts and addresses the web and browser tools may fetch from.

    Order of the decision: ``deny_hosts`` and ``deny_cidrs`` always refuse; then ``allow_hosts``
    and ``allow_cidrs`` admit; then the built-in denied ranges (every non-public address) refuse;
    every other address is allowed. ``allow_hosts`` trusts a *name* whatever it resolves to (an
    intranet search engine); prefer ``allow_cidrs``, which admits the checked addresses only.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    allow_cidrs: tuple[IPNetwork, ...] = Field(
        (), description="address ranges admitted although non-public, e.g. ['127.0.0.0/8'] for tests"
    )
    deny_cidrs: tuple[IPNetwork, ...] = Field((), description="address ranges always refused")
    allow_hosts: tuple[str, ...] = Field(
        (), description="host names admitted whatever they resolve to ('name' or '*.domain')"
    )
    deny_hosts: tuple[str, ...] = Field((), description="host names always refused ('name' or '*.domain')")
    allowed_ports: tuple[int, ...] | None = Field(None, description="only these ports (None: any port)")

    @field_validator("allow_cidrs", "deny_cidrs", mode="before")
    @classmethod
    def _strict_cidrs(cls, value: object) -> object:
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, list | tuple):
            return value
        out = []
        for item in items:
            try:
                out.append(ipaddress.ip_network(item, strict=False) if isinstance(item, str) else item)
            except ValueError as exc:
                raise ValueError(
                    f"{item!r} is not an address range; write it as CIDR, e.g. '10.0.0.0/8'"
                ) from exc
        return tuple(out)

    @field_validator("allow_hosts", "deny_hosts", mode="before")
    @classmethod
    def _hosts(cls, value: object) -> object:
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, list | tuple):
            return value
        out = []
        for item in items:
            if not isinstance(item, str) or not item.strip(".* ") or "/" in item or ":" in item:
                raise ValueError(f"{item!r} is not a host name; write 'example.com' or '*.example.com'")
            wild = item.strip().startswith("*.")
            try:  # the form the gate compares: IDNA-mapped, lower case, no trailing dot
                name = canonical_target(f"http://{item.strip().removeprefix('*.')}/").host
            except NetPolicyError:
                raise ValueError(
                    f"{item!r} is not a host name; write 'example.com' or '*.example.com'"
                ) from None
            out.append(f"*.{name}" if wild else name)
        return tuple(out)

    def address_denial(self, ip: IPAddress | str, host: str | None = None) -> str | None:
        """Why connecting to ``ip`` (reached through the name ``host``) is refused, or None.

        An IPv6 address that embeds an IPv4 one is judged as that IPv4 address first (so
        ``::ffff:127.0.0.1`` is loopback, and an allowed ``127.0.0.0/8`` admits it), then as
        itself (so a deprecated IPv4-compatible address of a public host is still refused).
        """
        orig = ipaddress.ip_address(ip) if isinstance(ip, str) else ip
        addr = _unembed(orig)
        forms = (addr,) if addr == orig else (addr, orig)
        name = (host or "").lower().rstrip(".")
        if name and _host_matches(name, self.deny_hosts):
            return f"host {name!r} is in deny_hosts"
        for net in self.deny_cidrs:
            if any(_in(a, net) for a in forms):
                return f"{addr} is in deny_cidrs ({net})"
        if name and _host_matches(name, self.allow_hosts):
            return None
        if any(_in(addr, net) for net in self.allow_cidrs):
            return None
        for form in forms:
            for net, why in DEFAULT_DENIED:
                if _in(form, net):
                    return (
                        f"{form} is a {why} address ({net}), which the network policy denies; "
                        f"to allow it add {str(net)!r} (or a narrower range) to the policy's allow_cidrs"
                    )
        return None

    def gate(self, url: str | URL) -> Target:
        """The one URL gate: ``url`` parsed into the :class:`Target` the client will be handed,
        and everything about it that can be checked before resolving (scheme, host syntax, port,
        host names, an IP literal in any spelling). Raises :class:`NetPolicyError` with the reason.
        """
        target = canonical_target(url)
        shown = str(url)[:300]
        if self.allowed_ports is not None and target.port not in self.allowed_ports:
            raise NetPolicyError(
                f"refused {shown!r}: port {target.port} is not in the policy's allowed_ports"
            )
        if _host_matches(target.host, self.deny_hosts):
            raise NetPolicyError(f"refused {shown!r}: host {target.host!r} is in the policy's deny_hosts")
        if target.address is not None:
            why = self.address_denial(target.address, target.host)
            if why is not None:
                raise NetPolicyError(f"refused {shown!r}: {why}")
        return target

    async def resolve_checked(self, target: Target, resolve: Resolve | None = None) -> list[IPAddress]:
        """The allowed addresses of a gated ``target`` (resolved once); refuses when none is.

        Raises :class:`NetPolicyError` (refused) or ``OSError`` (the name does not resolve).
        """
        if target.address is not None:
            why = self.address_denial(target.address, target.host)
            if why is not None:
                raise NetPolicyError(f"refused {target.host}: {why}")
            return [target.address]
        addrs = await (resolve or system_resolve)(target.host, target.port)
        allowed: list[IPAddress] = []
        denied: list[str] = []
        for addr in addrs:
            why = self.address_denial(addr, target.host)
            if why is None:
                if addr not in allowed:
                    allowed.append(addr)
            else:
                denied.append(why)
        if not allowed:
            reason = denied[0] if denied else "no address"
            raise NetPolicyError(f"refused host {target.host!r}: it resolves to {reason}")
        return allowed

    def trusting(self, url: str) -> NetPolicy:
        """This policy with the host of ``url`` admitted: for an endpoint the *operator*
        configured (a search API on the intranet), whose redirects elsewhere stay checked.
        The deny lists still win."""
        target = canonical_target(url)
        if target.address is not None:
            net = ipaddress.ip_network(target.address)
            return self.model_copy(update={"allow_cidrs": (*self.allow_cidrs, net)})
        return self.model_copy(update={"allow_hosts": (*self.allow_hosts, target.host)})


# -- connect time ---------------------------------------------------------------------------------


@dataclass
class _Hop:
    """One gated request in flight: what it may connect to."""

    target: Target
    resolved: set[IPAddress] = field(default_factory=set)


_HOP: contextvars.ContextVar[_Hop | None] = contextvars.ContextVar("trajforge_gated_hop", default=None)


class GatedConnector:
    """The parts of an aiohttp connector that make "checked" and "connected" the same address.

    Use :meth:`hop` around each request of a gated :class:`Target`; the resolver and the socket
    factory read it (a context variable: concurrent requests on one session each see their own).
    """

    def __init__(self, policy: NetPolicy, resolve: Resolve | None = None) -> None:
        self.policy = policy
        self.resolve = resolve or system_resolve
        self.resolver = _PolicyResolver(self)

    def hop(self, target: Target) -> contextvars.Token[_Hop | None]:
        """Mark ``target`` as the request being made in this context (reset with the token)."""
        return _HOP.set(_Hop(target))

    @staticmethod
    def done(token: contextvars.Token[_Hop | None]) -> None:
        _HOP.reset(token)

    async def resolve_for(self, host: str, port: int) -> list[IPAddress]:
        hop = _HOP.get()
        if hop is None:
            raise ConnectRefused(f"refused a lookup of {host!r} outside a gated request")
        if host != hop.target.host:
            raise ConnectRefused(
                f"refused a lookup of {host!r}: the request was gated for {hop.target.host!r}"
            )
        try:
            allowed = await self.policy.resolve_checked(hop.target, self.resolve)
        except NetPolicyError as exc:
            raise ConnectRefused(str(exc)) from None
        hop.resolved.update(allowed)
        return allowed

    def socket_factory(self, addr_info: tuple[int, int, int, str, tuple[object, ...]]) -> socket.socket:
        """aiohttp's ``socket_factory``: called with the exact address about to be connected to,
        for every connection, IP literals included. Refuses before any byte is sent."""
        family, type_, proto, _canon, sockaddr = addr_info
        hop = _HOP.get()
        if hop is None:
            raise ConnectRefused("refused a connection outside a gated request")
        if family not in (socket.AF_INET, socket.AF_INET6):
            raise ConnectRefused(f"refused a connection of address family {family}")
        try:
            addr = ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0])
        except ValueError:
            raise ConnectRefused(f"refused a connection to {sockaddr[0]!r}: not an IP address") from None
        target = hop.target
        expected = {target.address} if target.address is not None else hop.resolved
        if addr not in expected:
            raise ConnectRefused(
                f"refused a connection to {addr}: the request was gated for {target.host} ({sorted(map(str, expected))})"
            )
        why = self.policy.address_denial(addr, target.host)
        if why is not None:
            raise ConnectRefused(f"refused {target.host}: {why}")
        return socket.socket(family=family, type=type_, proto=proto)


class _PolicyResolver(AbstractResolver):
    """An aiohttp resolver that resolves the gated host once and returns only allowed addresses.

    aiohttp connects to exactly the addresses a resolver returns, so the checked address is the
    connected address (no second lookup, no DNS rebinding).
    """

    def __init__(self, gate: GatedConnector) -> None:
        self._gate = gate

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        addrs = await self._gate.resolve_for(host, port)
        wanted = [a for a in addrs if family == socket.AF_UNSPEC or _family(a) == family] or addrs
        return [
            ResolveResult(
                hostname=host,
                host=str(a),
                port=port,
                family=_family(a),
                proto=0,
                flags=socket.AI_NUMERICHOST,
            )
            for a in wanted
        ]

    async def close(self) -> None:
        return None


def _family(addr: IPAddress) -> socket.AddressFamily:
    return socket.AF_INET if addr.version == 4 else socket.AF_INET6
