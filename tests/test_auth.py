"""agent/auth.py: operator keys, client tokens, session limits, origins and the bind rule,
driven with explicit `now` values (no sleeping, no server)."""

import hashlib
import hmac

import pytest
from starlette.datastructures import Headers

from agent import auth
from agent.auth import (
    ANONYMOUS_KEY_ID, CLIENT_TOKEN_PREFIX, AccessControl, AuthConfig, ClientTokens, OperatorKeys, SessionLimits,
    bind_refusal, check_origin, operator_keys, presented_credential,
)
from agent.config import build_dataclass
from agent.errors import (
    BadInputError, CadenceError, CapacityError, ConfigError, ForbiddenError, SessionLimitError, UnauthorizedError,
)

KEY_A = "sk-live-AAAAAAAAAAAAAAAAAAAAAAAA"
KEY_B = "sk-live-BBBBBBBBBBBBBBBBBBBBBBBB"
KEY_C = "sk-live-CCCCCCCCCCCCCCCCCCCCCCCC"
T0 = 1_000_000.0


def headers(**pairs: str) -> Headers:
    return Headers({name.replace("_", "-"): value for name, value in pairs.items()})


def reason_of(call) -> str:
    with pytest.raises(UnauthorizedError) as caught:
        call()
    return caught.value.reason


# --- configuration ---------------------------------------------------------------------------

def test_defaults_are_valid_and_keys_stay_out_of_repr():
    assert AuthConfig().client_token_ttl_s == 60.0
    config = AuthConfig(api_keys=(KEY_A,))
    assert KEY_A not in repr(config) and KEY_A not in str(config)


@pytest.mark.parametrize("kwargs, fragment", [
    ({"api_keys": ("sk-tiny-9",)}, "shorter than 16"),
    ({"api_keys": ("has a space in this key",)}, "spaces"),
    ({"api_keys": ("comma,inside-this-long-key",)}, "commas"),
    ({"api_keys": ("kéy-with-non-ascii-chars",)}, "non-ASCII"),
    ({"api_keys": (CLIENT_TOKEN_PREFIX + "looks-like-a-client-token",)}, "marks client tokens"),
    ({"client_token_ttl_s": 0}, "client_token_ttl_s"),
    ({"client_token_ttl_s": 601}, "client_token_ttl_s"),
    ({"max_outstanding_client_tokens": 0}, "max_outstanding_client_tokens"),
    ({"max_sessions_per_key": 0}, "max_sessions_per_key"),
    ({"allowed_origins": ("*",)}, "allowed_origins"),
    ({"allowed_origins": ("null",)}, "allowed_origins"),
    ({"allowed_origins": ("https://app.example.com/",)}, "allowed_origins"),
    ({"allowed_origins": ("https://app.example.com/path",)}, "allowed_origins"),
    ({"allowed_origins": ("HTTPS://App.example.com",)}, "allowed_origins"),
    ({"allowed_origins": ("app.example.com",)}, "allowed_origins"),
    ({"allowed_origins": ("ftp://app.example.com",)}, "allowed_origins"),
])
def test_bad_settings_are_refused_without_echoing_keys(kwargs, fragment):
    with pytest.raises(ValueError) as caught:
        AuthConfig(**kwargs)
    assert fragment in str(caught.value)
    for key in kwargs.get("api_keys", ()):
        assert key not in str(caught.value)


def test_good_origins_are_accepted():
    origins = ("https://app.example.com", "http://localhost:5173", "http://127.0.0.1:8000", "https://[::1]:8443")
    assert AuthConfig(allowed_origins=origins).allowed_origins == origins


def test_drops_in_as_a_config_section():
    config = build_dataclass(AuthConfig, {"api_keys": [KEY_A], "allowed_origins": ["https://a.example"],
                                          "max_sessions_per_key": 3}, "config.auth")
    assert config == AuthConfig(api_keys=(KEY_A,), allowed_origins=("https://a.example",), max_sessions_per_key=3)
    with pytest.raises(ConfigError, match="config.auth.api_key: unknown key"):
        build_dataclass(AuthConfig, {"api_key": KEY_A}, "config.auth")
    with pytest.raises(ConfigError, match="config.auth: .*shorter") as caught:
        build_dataclass(AuthConfig, {"api_keys": ["tiny-key"]}, "config.auth")
    assert "tiny-key" not in str(caught.value)


def test_keys_come_from_config_and_environment_once_each():
    config = AuthConfig(api_keys=(KEY_A,), api_keys_env="MY_KEYS")
    environ = {"MY_KEYS": f" {KEY_B} ,, {KEY_A},{KEY_C} ", "CADENCE_API_KEYS": "ignored-because-not-named"}
    assert operator_keys(config, environ) == (KEY_A, KEY_B, KEY_C)
    assert operator_keys(config, {}) == (KEY_A,)
    assert operator_keys(AuthConfig(), {"CADENCE_API_KEYS": ""}) == ()


def test_a_bad_key_in_the_environment_names_the_variable_not_the_key():
    with pytest.raises(ConfigError) as caught:
        operator_keys(AuthConfig(), {"CADENCE_API_KEYS": f"{KEY_A},weak"})
    assert "$CADENCE_API_KEYS" in str(caught.value) and "weak" not in str(caught.value)


# --- presented credentials -------------------------------------------------------------------

@pytest.mark.parametrize("given", [
    headers(authorization=f"Bearer {KEY_A}"),
    headers(Authorization=f"bearer {KEY_A}"),
    headers(AUTHORIZATION=f"  BEARER   {KEY_A}  "),
    headers(api_key=KEY_A),
    headers(API_Key=f" {KEY_A} "),
    headers(authorization=f"Bearer {KEY_A}", api_key=KEY_A),
    {"authorization": f"Bearer {KEY_A}"},  # an ASGI scope's lowercase names
])
def test_the_key_is_read_from_either_header(given):
    assert presented_credential(given) == KEY_A


def test_no_credential_headers_is_none():
    assert presented_credential(headers(origin="https://a.example", cookie="x=1")) is None
    assert presented_credential({}) is None


@pytest.mark.parametrize("given", [
    headers(authorization=f"Basic {KEY_A}"),
    headers(authorization=KEY_A),  # the key without a scheme: not echoed back
    headers(authorization="Bearer"),
    headers(authorization="Bearer "),
    headers(authorization=""),
    headers(authorization=f"Bearer {KEY_A} extra"),
    headers(authorization=f"Bearer\t{KEY_A}"),
    headers(api_key=""),
    headers(api_key=f"{KEY_A} {KEY_B}"),
    headers(authorization=f"Bearer {KEY_A}", api_key=KEY_B),
])
def test_malformed_credentials_are_refused_with_a_reason_and_no_echo(given):
    with pytest.raises(UnauthorizedError) as caught:
        presented_credential(given)
    assert caught.value.reason == "malformed"
    assert "Bearer <key>" in str(caught.value) or "api-key" in str(caught.value)
    assert KEY_A not in str(caught.value) and KEY_B not in repr(caught.value)


# --- operator keys ---------------------------------------------------------------------------

def test_keys_are_identified_by_position():
    keys = OperatorKeys((KEY_A, KEY_B, KEY_C))
    assert [keys.identify(k) for k in (KEY_A, KEY_B, KEY_C)] == ["key-1", "key-2", "key-3"]
    assert len(keys) == 3


@pytest.mark.parametrize("presented", [KEY_A + "x", KEY_A[:-1], "", "sk-live-ÄÄÄÄÄÄÄÄÄÄÄÄÄÄÄÄ", KEY_A.upper()])
def test_other_keys_are_invalid(presented):
    assert reason_of(lambda: OperatorKeys((KEY_A, KEY_B)).identify(presented)) == "invalid"


@pytest.mark.parametrize("presented", [KEY_A, KEY_C, "sk-live-not-a-configured-key"])
def test_every_stored_digest_is_compared_in_constant_time_whichever_matches(monkeypatch, presented):
    keys = OperatorKeys((KEY_A, KEY_B, KEY_C))
    compared, real_compare = [], hmac.compare_digest

    def spy(a, b):
        compared.append((a, b))
        return real_compare(a, b)

    monkeypatch.setattr(auth.hmac, "compare_digest", spy)
    try:
        keys.identify(presented)
    except UnauthorizedError:
        pass
    assert len(compared) == 3  # no early exit on the first key's match
    assert all(isinstance(a, bytes) and len(a) == 32 for pair in compared for a in pair)


def test_keys_are_stored_only_as_salted_digests():
    one, two = OperatorKeys((KEY_A,)), OperatorKeys((KEY_A,))
    for store in (one, two):
        state = repr(vars(store))
        assert KEY_A not in state and KEY_A.encode() not in store._stored[0][1]
        assert store._stored[0][1] != hashlib.sha256(KEY_A.encode()).digest()  # salted, not plain sha256
    assert one._stored[0][1] != two._stored[0][1]  # a salt per store
    assert KEY_A not in repr(one) and KEY_A not in str(one)


# --- client tokens ---------------------------------------------------------------------------

def tokens(max_outstanding: int = 10) -> ClientTokens:
    return ClientTokens(max_outstanding=max_outstanding)


def test_a_minted_token_is_recognisable_random_and_hidden_from_repr():
    store = tokens()
    first, second = store.mint("key-1", 60, T0), store.mint("key-1", 60, T0)
    assert first.value.startswith(CLIENT_TOKEN_PREFIX) and len(first.value) >= 40
    assert first.value != second.value
    assert (first.key_id, first.expires_at) == ("key-1", T0 + 60)
    assert first.value not in repr(first) and first.value not in str(first)
    assert first.value not in repr(store) and first.value not in repr(vars(store))


def test_a_token_is_redeemed_once_then_reads_as_reused():
    store = tokens()
    token = store.mint("key-2", 60, T0).value
    assert store.key_id_of(token, T0 + 1) == "key-2"  # a look does not use it up
    assert store.redeem(token, T0 + 1) == "key-2"
    assert reason_of(lambda: store.redeem(token, T0 + 2)) == "reused"
    assert reason_of(lambda: store.key_id_of(token, T0 + 2)) == "reused"


def test_a_token_expires_at_its_expiry():
    store = tokens()
    token = store.mint("key-1", 30, T0).value
    assert reason_of(lambda: store.redeem(token, T0 + 30)) == "expired"
    assert reason_of(lambda: store.redeem(token, T0 + 31)) == "expired"
    live = store.mint("key-1", 30, T0).value
    assert store.redeem(live, T0 + 29.999) == "key-1"


@pytest.mark.parametrize("presented", ["ek_made-up", KEY_A, "", CLIENT_TOKEN_PREFIX])
def test_unknown_tokens_are_unknown(presented):
    store = tokens()
    store.mint("key-1", 60, T0)
    assert reason_of(lambda: store.redeem(presented, T0)) == "unknown"


def test_a_purged_token_reads_as_unknown():
    store = tokens()
    token = store.mint("key-1", 10, T0).value
    assert store.purge_expired(T0 + 9) == 0
    assert store.purge_expired(T0 + 10) == 1 and len(store) == 0
    assert reason_of(lambda: store.redeem(token, T0 + 11)) == "unknown"


@pytest.mark.parametrize("ttl_s", [0, -1, 601])
def test_lifetimes_out_of_range_are_bad_input(ttl_s):
    with pytest.raises(BadInputError, match="lifetime"):
        tokens().mint("key-1", ttl_s, T0)


def test_outstanding_tokens_are_bounded_and_expired_ones_make_room():
    store = tokens(max_outstanding=2)
    short = store.mint("key-1", 10, T0)
    used = store.mint("key-1", 60, T0)
    store.redeem(used.value, T0)  # a used token still counts until it expires
    with pytest.raises(CapacityError) as caught:
        store.mint("key-1", 60, T0 + 9)
    assert caught.value.retryable and "2 client tokens" in str(caught.value)
    assert len(store) == 2
    fresh = store.mint("key-1", 60, T0 + 10)  # `short` expired and was purged
    assert len(store) == 2 and store.redeem(fresh.value, T0 + 10) == "key-1"
    assert reason_of(lambda: store.redeem(short.value, T0 + 10)) == "unknown"


# --- session limits --------------------------------------------------------------------------

def test_the_limit_refuses_at_once_with_a_retryable_error_that_says_the_numbers():
    limits = SessionLimits(max_per_key=2)
    limits.acquire("key-1"), limits.acquire("key-1")
    with pytest.raises(SessionLimitError) as caught:
        limits.acquire("key-1")
    error = caught.value
    assert isinstance(error, CapacityError) and error.retryable
    assert (error.key_id, error.limit, error.open_sessions) == ("key-1", 2, 2)
    assert "2 sessions open" in str(error) and "limit of 2" in str(error)
    assert limits.acquire("key-2").key_id == "key-2"  # keys do not share a limit


def test_release_frees_a_slot_and_is_idempotent():
    limits = SessionLimits(max_per_key=2)
    first, second = limits.acquire("key-1"), limits.acquire("key-1")
    assert first != second
    limits.release(first)
    limits.release(first)  # twice must not free `second`'s slot too
    assert limits.open_sessions("key-1") == 1
    third = limits.acquire("key-1")
    with pytest.raises(SessionLimitError):
        limits.acquire("key-1")
    limits.release(second), limits.release(third)
    assert limits.open_sessions("key-1") == 0
    limits.release(third)
    assert limits.open_sessions("never-seen") == 0


# --- access control: keys, tokens and limits together ---------------------------------------

def control(max_sessions: int = 1, keys: tuple[str, ...] = (KEY_A, KEY_B)) -> AccessControl:
    return AccessControl(AuthConfig(max_sessions_per_key=max_sessions, client_token_ttl_s=30), keys)


def test_operator_keys_open_sessions_and_need_to_be_valid():
    access = control()
    assert access.admit(KEY_B, T0).key_id == "key-2"
    assert reason_of(lambda: access.admit(None, T0)) == "missing"
    assert reason_of(lambda: access.admit("sk-live-someone-elses-key", T0)) == "invalid"


def test_a_client_token_counts_against_the_key_that_minted_it():
    access = control(max_sessions=1)
    token = access.mint(KEY_A, T0)
    assert (token.key_id, token.expires_at) == ("key-1", T0 + 30)  # the configured lifetime
    lease = access.admit(token.value, T0 + 1)
    assert lease.key_id == "key-1"
    with pytest.raises(SessionLimitError):
        access.admit(KEY_A, T0 + 1)
    assert access.admit(KEY_B, T0 + 1).key_id == "key-2"
    access.release(lease)
    assert access.admit(KEY_A, T0 + 2).key_id == "key-1"


def test_a_refused_session_does_not_burn_its_token():
    access = control(max_sessions=1)
    held = access.admit(KEY_A, T0)
    token = access.mint(KEY_A, T0).value
    with pytest.raises(SessionLimitError):
        access.admit(token, T0 + 1)
    access.release(held)
    assert access.admit(token, T0 + 2).key_id == "key-1"
    assert reason_of(lambda: access.admit(token, T0 + 3)) == "reused"


def test_a_client_token_cannot_mint_another():
    access = control()
    token = access.mint(KEY_A, T0, ttl_s=10).value
    assert reason_of(lambda: access.mint(token, T0)) == "invalid"
    assert reason_of(lambda: access.mint(None, T0)) == "missing"


def test_without_keys_everyone_is_anonymous_and_still_limited():
    access = control(max_sessions=1, keys=())
    lease = access.admit(None, T0)
    assert lease.key_id == ANONYMOUS_KEY_ID
    with pytest.raises(SessionLimitError):
        access.admit("anything-at-all", T0)
    assert access.mint(None, T0).key_id == ANONYMOUS_KEY_ID


def test_nothing_secret_reaches_repr_or_errors():
    access = control(max_sessions=1)
    token = access.mint(KEY_A, T0).value
    access.admit(token, T0)
    failures = []
    for attempt in (lambda: access.admit(token, T0), lambda: access.admit(KEY_A, T0),
                    lambda: access.admit(KEY_A + "x", T0), lambda: access.mint(token, T0),
                    lambda: presented_credential(headers(authorization=KEY_B))):
        with pytest.raises(CadenceError) as caught:
            attempt()
        failures.append(caught.value)
    assert [type(e) for e in failures] == [UnauthorizedError, SessionLimitError, UnauthorizedError,
                                           UnauthorizedError, UnauthorizedError]
    shown = " ".join([repr(access), repr(access.keys), repr(access.tokens), repr(access.config)]
                     + [f"{e} {e!r}" for e in failures])
    for secret in (KEY_A, KEY_B, token, token[len(CLIENT_TOKEN_PREFIX):]):
        assert secret not in shown


# --- origins ---------------------------------------------------------------------------------

ALLOWED = ("https://app.example.com", "http://localhost:5173")


@pytest.mark.parametrize("origin", [None, "https://app.example.com", "http://localhost:5173"])
def test_a_missing_or_listed_origin_is_allowed(origin):
    assert check_origin(origin, ALLOWED) is None


@pytest.mark.parametrize("origin", [
    "https://evil.example.com", "http://app.example.com", "https://app.example.com:8443",
    "https://app.example.com/", "https://app.example.com.evil.net", "http://localhost:5174", "null", "",
])
def test_a_present_unlisted_origin_is_refused(origin):
    with pytest.raises(ForbiddenError, match="allowed_origins"):
        check_origin(origin, ALLOWED)


def test_with_no_origins_listed_only_non_browser_clients_pass():
    check_origin(None, ())
    with pytest.raises(ForbiddenError):
        check_origin("https://app.example.com", ())


# --- the bind rule ---------------------------------------------------------------------------

@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "LOCALHOST", "::1", "[::1]", "127.0.0.2"])
def test_loopback_may_run_without_keys(host):
    assert bind_refusal(host, has_keys=False) is None


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "", "192.168.1.20", "10.0.0.1", "cadence.example.com",
                                  "localhost.example.com"])
def test_other_addresses_without_keys_refuse_to_start(host):
    message = bind_refusal(host, has_keys=False)
    assert message is not None and "without API keys" in message
    assert "auth.api_keys" in message and "127.0.0.1" in message and "insecure" in message
    assert bind_refusal(host, has_keys=True) is None
    assert bind_refusal(host, has_keys=False, insecure=True) is None


# --- the error tree --------------------------------------------------------------------------

def test_the_new_errors_live_in_the_one_tree():
    from agent import errors
    for name in ("UnauthorizedError", "ForbiddenError", "SessionLimitError"):
        assert name in errors.__all__ and issubclass(getattr(errors, name), CadenceError)
    assert not UnauthorizedError("x", reason="unknown").retryable and not ForbiddenError("x").retryable
    assert SessionLimitError("x", key_id="key-1", limit=1, open_sessions=1).retryable
