"""Who may open a session, as plain logic: no web framework, no I/O, no clock of its own.

Operator API keys are kept only as salted HMAC-SHA256 digests, checked in constant time. A
backend holding a key mints short-lived, single-use client tokens for browsers (as OpenAI's
client secrets); their sessions count against that key's cap on concurrent sessions.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import itertools
import re
import secrets
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field

from agent.errors import BadInputError, CapacityError, ConfigError, ForbiddenError, SessionLimitError, UnauthorizedError

CLIENT_TOKEN_PREFIX = "ek_"  # tells a client token from an operator key at a glance, and in code
CLIENT_TOKEN_BYTES = 32  # 256 bits: not guessable within any token's lifetime
# A leaked client token (a browser's devtools, a log) is good for at most this long.
MAX_CLIENT_TOKEN_TTL_S = 600.0
# Shorter keys are guessable online; 16 URL-safe characters are ~96 bits.
MIN_API_KEY_CHARS = 16
ANONYMOUS_KEY_ID = "anonymous"  # whose sessions they are when no keys are configured (loopback only)
# An Origin as browsers serialise it: lowercase scheme://host[:port], no path, no trailing slash.
ORIGIN_PATTERN = re.compile(r"https?://(\[[0-9a-f:.]+\]|[a-z0-9.-]+)(:[0-9]{1,5})?")


@dataclass(frozen=True)
class AuthConfig:
    """The `auth:` section. Keys come from here and from the environment variable named below."""

    # Raw operator keys; kept out of repr so that a logged config never shows them.
    api_keys: tuple[str, ...] = field(default=(), repr=False)
    # Environment variable holding more keys, comma-separated (keeps keys out of YAML files).
    api_keys_env: str = "CADENCE_API_KEYS"
    client_token_ttl_s: float = 60.0  # a minted token's life: long enough for a page to connect
    # Minted tokens not yet expired (used or not); more is refused, bounding memory.
    max_outstanding_client_tokens: int = 1000
    max_sessions_per_key: int = 10  # concurrent sessions per operator key, its tokens' included
    # Browser origins allowed to start calls or change agents, exactly as the Origin header reads
    # ("https://app.example.com"). This server's own pages are always allowed when reached by
    # IP address or localhost. Clients that send no Origin (phones, SDKs) are judged by key alone.
    allowed_origins: tuple[str, ...] = ()
    # Environment variable holding the Twilio account's auth token: when set, the phone socket
    # accepts a valid X-Twilio-Signature in place of an API key (Twilio cannot send our key).
    twilio_auth_token_env: str = "TWILIO_AUTH_TOKEN"

    def __post_init__(self) -> None:
        problems = [f"api_keys: {p}" for p in map(api_key_problem, self.api_keys) if p]
        problems += [f"allowed_origins: {o!r} is not a lowercase scheme://host[:port]"  # "*", "null" neither
                     for o in self.allowed_origins if not ORIGIN_PATTERN.fullmatch(o)]
        if not 0 < self.client_token_ttl_s <= MAX_CLIENT_TOKEN_TTL_S:
            problems.append(f"client_token_ttl_s must be in (0, {MAX_CLIENT_TOKEN_TTL_S:g}]")
        if min(self.max_outstanding_client_tokens, self.max_sessions_per_key) < 1:
            problems.append("max_outstanding_client_tokens and max_sessions_per_key must be >= 1")
        if problems:
            raise ValueError("; ".join(problems))


def api_key_problem(key: str) -> str | None:
    """Why a key cannot be an operator key, or None. Never repeats the key."""
    if len(key) < MIN_API_KEY_CHARS:
        return f"a key is shorter than {MIN_API_KEY_CHARS} characters; generate a longer random one"
    if not (key.isascii() and key.isprintable()) or " " in key or "," in key:
        return "a key has spaces, commas or non-ASCII characters; use URL-safe characters"
    if key.startswith(CLIENT_TOKEN_PREFIX):
        return f"a key starts with {CLIENT_TOKEN_PREFIX!r}, which marks client tokens; choose another"
    return None


def operator_keys(config: AuthConfig, environ: Mapping[str, str]) -> tuple[str, ...]:
    """The configured keys, then those in the environment variable (duplicates once)."""
    from_env = [k.strip() for k in environ.get(config.api_keys_env, "").split(",") if k.strip()]
    for key in from_env:
        problem = api_key_problem(key)
        if problem:
            raise ConfigError(f"${config.api_keys_env}: {problem}")
    return tuple(dict.fromkeys((*config.api_keys, *from_env)))


def presented_credential(headers: Mapping[str, str]) -> str | None:
    """The key or token from `Authorization: Bearer <x>` or `api-key: <x>`; None if neither.

    `headers` must look names up case-insensitively (Starlette's Headers) or be keyed in
    lowercase (ASGI). Raises UnauthorizedError (malformed) for anything else.
    """
    authorization, api_key = headers.get("authorization"), headers.get("api-key")
    bearer = None
    if authorization is not None:
        scheme, _, rest = authorization.strip().partition(" ")
        bearer = rest.strip()
        # RFC 9110: the scheme is case-insensitive. Not echoed: a bare key would sit in its place.
        if scheme.lower() != "bearer" or not bearer or any(c.isspace() for c in bearer):
            raise UnauthorizedError("Authorization header must be 'Bearer <key>'", reason="malformed")
    if api_key is not None:
        api_key = api_key.strip()
        if not api_key or any(c.isspace() for c in api_key):
            raise UnauthorizedError("api-key header must be the key alone", reason="malformed")
    if bearer is not None and api_key is not None and bearer != api_key:  # both are the caller's
        raise UnauthorizedError("Authorization and api-key carry different keys; send one", reason="malformed")
    return bearer if bearer is not None else api_key


def check_origin(origin: str | None, allowed: tuple[str, ...]) -> None:
    """A missing Origin is a non-browser client (telephony, SDKs): allowed, the key decides.
    A present one must be listed exactly; a browser page elsewhere must not ride a user's access."""
    if origin is not None and origin not in allowed:
        raise ForbiddenError(f"Origin {origin[:100]!r} is not in auth.allowed_origins; add it there to allow it")


def bind_refusal(host: str, has_keys: bool, *, insecure: bool = False) -> str | None:
    """Why the server must not start on `host`, or None. Loopback needs no keys: only this machine
    can connect. Any other address without keys lets anyone who reaches it spend our compute."""
    if has_keys or insecure or _is_loopback(host):
        return None
    return (f"refusing to listen on {host or 'all interfaces'!r} without API keys: anyone who can reach it "
            f"could open sessions. Set auth.api_keys (or $CADENCE_API_KEYS), bind to 127.0.0.1, "
            f"or start with insecure=True to accept an open server")


def _is_loopback(host: str) -> bool:
    name = host.strip().lower().removeprefix("[").removesuffix("]")
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:  # a hostname other than localhost may resolve anywhere
        return False


def _salted_digest(salt: bytes, secret: str) -> bytes:
    """HMAC-SHA256 under a random per-store salt: a memory dump gives no key, and nothing to
    compare across two stores or two runs."""
    return hmac.new(salt, secret.encode("utf-8", "surrogatepass"), hashlib.sha256).digest()


class OperatorKeys:
    """The operator keys as digests, each named key-1, key-2, ... in configured order."""

    def __init__(self, raw_keys: tuple[str, ...], *, salt: bytes | None = None) -> None:
        self._salt = salt or secrets.token_bytes(32)
        self._stored = tuple((f"key-{n}", _salted_digest(self._salt, key)) for n, key in enumerate(raw_keys, 1))

    def __len__(self) -> int:
        return len(self._stored)

    def __repr__(self) -> str:  # counts only: never a key or digest
        return f"OperatorKeys({len(self)} keys)"

    def identify(self, presented: str) -> str:
        """The key id of `presented`, or UnauthorizedError (invalid). Every stored digest is
        compared, whichever matches, so the time taken says nothing about which one did."""
        digest, matched = _salted_digest(self._salt, presented), None
        for key_id, stored in self._stored:
            if hmac.compare_digest(digest, stored):
                matched = key_id
        if matched is None:
            raise UnauthorizedError("API key not accepted; check it against the server's keys", reason="invalid")
        return matched


@dataclass(frozen=True)
class ClientToken:
    value: str = field(repr=False)  # give it to one browser, once; never log it
    key_id: str  # the operator key it was minted under, which its session counts against
    expires_at: float


@dataclass
class _StoredToken:
    key_id: str
    expires_at: float
    redeemed: bool = False


class ClientTokens:
    """Minted tokens by digest. A redeemed one is kept until it expires, so that a second use
    reads as "reused" (a leak worth noticing) rather than "unknown"."""

    def __init__(self, *, max_outstanding: int, max_ttl_s: float = MAX_CLIENT_TOKEN_TTL_S,
                 salt: bytes | None = None) -> None:
        self._salt = salt or secrets.token_bytes(32)
        self._max_outstanding, self._max_ttl_s = max_outstanding, max_ttl_s
        # Looked up by HMAC digest: a caller cannot steer the digest, so lookup timing tells nothing.
        self._tokens: dict[bytes, _StoredToken] = {}

    def __len__(self) -> int:
        return len(self._tokens)

    def __repr__(self) -> str:
        return f"ClientTokens({len(self)} outstanding of {self._max_outstanding})"

    def purge_expired(self, now: float) -> int:
        before = len(self._tokens)
        self._tokens = {digest: t for digest, t in self._tokens.items() if now < t.expires_at}
        return before - len(self._tokens)

    def mint(self, for_key_id: str, ttl_s: float, now: float) -> ClientToken:
        if not 0 < ttl_s <= self._max_ttl_s:
            raise BadInputError(f"client token lifetime must be in (0, {self._max_ttl_s:g}] s, got {ttl_s:g}")
        self.purge_expired(now)
        if len(self._tokens) >= self._max_outstanding:
            raise CapacityError(f"{self._max_outstanding} client tokens are outstanding (the limit); "
                                f"retry when some expire, or raise auth.max_outstanding_client_tokens")
        value = CLIENT_TOKEN_PREFIX + secrets.token_urlsafe(CLIENT_TOKEN_BYTES)
        self._tokens[_salted_digest(self._salt, value)] = _StoredToken(for_key_id, now + ttl_s)
        return ClientToken(value=value, key_id=for_key_id, expires_at=now + ttl_s)

    def key_id_of(self, token: str, now: float) -> str:
        """The key a token was minted under, if it could be redeemed now; it stays unused."""
        stored = self._tokens.get(_salted_digest(self._salt, token))
        if stored is None:
            raise UnauthorizedError("client token unknown; mint a new one", reason="unknown")
        if stored.redeemed:
            raise UnauthorizedError("client token already used; each opens one session, mint another", reason="reused")
        if now >= stored.expires_at:
            raise UnauthorizedError("client token expired; mint one just before connecting", reason="expired")
        return stored.key_id

    def redeem(self, token: str, now: float) -> str:
        """Uses the token up; returns the key it was minted under."""
        key_id = self.key_id_of(token, now)
        self._tokens[_salted_digest(self._salt, token)].redeemed = True
        return key_id


@dataclass(frozen=True)
class SessionLease:
    key_id: str
    lease_id: int


class SessionLimits:
    """Open sessions per key. Refuses at once rather than queueing: a caller waiting on a
    connection that may never come is worse than a clear retry-later."""

    def __init__(self, max_per_key: int) -> None:
        self._max_per_key = max_per_key
        self._open: defaultdict[str, set[int]] = defaultdict(set)  # an entry per key: few
        self._lease_ids = itertools.count(1)

    def open_sessions(self, key_id: str) -> int:
        return len(self._open.get(key_id, ()))

    def acquire(self, key_id: str) -> SessionLease:
        open_now = self.open_sessions(key_id)
        if open_now >= self._max_per_key:
            raise SessionLimitError(
                f"key {key_id} has {open_now} sessions open, its limit of {self._max_per_key}; "
                f"end one or retry later", key_id=key_id, limit=self._max_per_key, open_sessions=open_now)
        lease = SessionLease(key_id, next(self._lease_ids))
        self._open[key_id].add(lease.lease_id)
        return lease

    def release(self, lease: SessionLease) -> None:
        """Idempotent: a session's every exit path may call it."""
        self._open[lease.key_id].discard(lease.lease_id)


class AccessControl:
    """Keys, tokens and limits together, in the order that keeps a refused session from
    burning its token: check the token, take a lease, then use the token up."""

    def __init__(self, config: AuthConfig, raw_keys: tuple[str, ...], *, salt: bytes | None = None) -> None:
        self.config = config
        self.keys = OperatorKeys(raw_keys, salt=salt)
        self.tokens = ClientTokens(max_outstanding=config.max_outstanding_client_tokens, salt=salt)
        self.limits = SessionLimits(config.max_sessions_per_key)

    def operator_key_id(self, credential: str | None) -> str:
        """For minting: an operator key only (a client token cannot mint another)."""
        if not self.keys:
            return ANONYMOUS_KEY_ID
        if credential is None:
            raise UnauthorizedError("no API key; send 'Authorization: Bearer <key>'", reason="missing")
        return self.keys.identify(credential)

    def mint(self, credential: str | None, now: float, ttl_s: float | None = None) -> ClientToken:
        key_id = self.operator_key_id(credential)
        return self.tokens.mint(key_id, self.config.client_token_ttl_s if ttl_s is None else ttl_s, now)

    def verify(self, credential: str | None, now: float) -> str:
        """The key a session would run under, checked now but taking nothing (no lease, no
        token used up): for a socket that must finish a handshake before it is a session."""
        if credential is None or not credential.startswith(CLIENT_TOKEN_PREFIX):
            return self.operator_key_id(credential)
        return self.tokens.key_id_of(credential, now)

    def admit(self, credential: str | None, now: float) -> SessionLease:
        lease = self.limits.acquire(self.verify(credential, now))
        if credential is not None and credential.startswith(CLIENT_TOKEN_PREFIX):
            self.tokens.redeem(credential, now)  # only once the lease is taken: a refusal burns no token
        return lease

    def release(self, lease: SessionLease) -> None:
        self.limits.release(lease)
