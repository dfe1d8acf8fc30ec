"""Registry URLs: `client_from_url` checks a Redis URL up front, then connects with redis-py.

redis-py checks a URL's query options only on the first connection, where an unknown one
is a `TypeError` and `socket_timeout=-1` a `ValueError`. Here they are checked before
anything connects, and a bad URL is a `ConfigError` whose message never holds the URL's
text: redis-py's own messages quote URL parts, and a password with an unescaped '/', '#',
'?' or '@' in it is split into the host, the path or the query. The keyword options given
with the URL are checked before connecting too: a name redis-py's client for the URL takes,
a value of the type it uses (an option a URL may hold by the same rule as there), never shown.
The text encoding is UTF-8, the only one the registry is read in.

Besides redis-py's `redis://`, `rediss://` and `unix://`, two forms name the deployments
redis-py has no URL for (the user info is the data nodes'; hosts are separated by commas):

- `redis+sentinel://[user:password@]host[:26379][,host[:26379]...]/<master name>[/<db>]`:
  the master a Sentinel names, through redis-py's `Sentinel.master_for`, so a failover is
  followed. `sentinel_username`/`sentinel_password` are the sentinels' own credentials; the
  `socket_*` options apply to the sentinels too.
- `redis+cluster://[user:password@]host[:6379][,host[:6379]...]`: a Redis Cluster
  (`redis.cluster.RedisCluster`), the hosts its startup nodes. redis-py discovers the slots
  as it builds the client, so an unreachable cluster raises `RegistryUnavailable` at once.

`rediss+sentinel://` and `rediss+cluster://` speak TLS to every server (the `ssl_*` options).
`ssl_cert_reqs`, in a URL or as a keyword, also takes the spellings Celery's result backend
and kombu take (`CERT_REQUIRED`, `CERT_OPTIONAL`, `CERT_NONE`, any case), passed on to
redis-py in its own (`required` ...), which is all it maps.
"""

from __future__ import annotations

import codecs
import enum
import functools
import inspect
import os
import re
import ssl
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple
from urllib.parse import (
    parse_qs,
    parse_qsl,
    unquote,
    unquote_plus,
    urlencode,
    urlsplit,
    urlunsplit,
)

import redis
import redis.connection
import redis.exceptions
from redis.backoff import NoBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.retry import Retry
from redis.sentinel import (
    Sentinel,
    SentinelConnectionPool,
    SentinelManagedConnection,
    SentinelManagedSSLConnection,
)

from .errors import ConfigError, RegistryUnavailable
from .utf8 import is_utf8

__all__ = ["SentinelRedis", "client_from_url"]

MALFORMED = (
    "invalid Redis URL: use redis://, rediss://, unix://, redis+sentinel:// or "
    "redis+cluster://, e.g. redis://user:password@host:6379/0, with special characters of "
    "the password escaped as %XX"
)
_ESCAPED = "with special characters of the password escaped as %XX"
MALFORMED_SENTINEL = (
    "invalid Redis URL: a Sentinel URL is redis+sentinel://[user:password@]host[:26379]"
    f"[,host[:26379]...]/<master name>[/<db>] (rediss+sentinel:// for TLS), {_ESCAPED}"
)
MALFORMED_CLUSTER = (
    "invalid Redis URL: a Cluster URL is redis+cluster://[user:password@]host[:6379]"
    f"[,host[:6379]...] (rediss+cluster:// for TLS), {_ESCAPED}"
)
# Not a word of the URL: the invalid byte may be in its password.
NOT_UTF8 = (
    "invalid Redis URL: it is not valid UTF-8; Redis takes its user name, password and "
    "options as UTF-8 text"
)
CLUSTER_DB = "invalid Redis URL: a Redis Cluster has only db 0; leave the db out"
DB_PATH = (
    "invalid Redis URL: the path must be a db number, e.g. redis://host:6379/0, with special "
    "characters of the password escaped as %XX"
)


class Rule(NamedTuple):
    """What an option's value must be: the words for it, a pattern its text in a URL must
    match in full, and the types redis-py takes it in as a keyword option, as it is (a query
    option's text it parses first: `socket_timeout="5"` fails on the first connection)."""

    words: str
    pattern: str
    types: tuple[type, ...] = (str,)


# Past 9 digits of seconds, Python's socket timeouts overflow a time_t (OverflowError).
_SECONDS = Rule(
    "a number of seconds above 0 and below 1e9",
    r"(?=.*[1-9])(0*\d{1,9}(\.\d*)?|\.\d+)",
    (int, float),
)
# A db number: redis-py's int() of a longer one fails and it quietly uses db 0.
_DB_DIGITS = r"0*\d{1,9}"
_COUNT = Rule("a whole number above 0", r"0*[1-9]\d*", (int,))
_WHOLE = Rule("a whole number", r"\d+", (int,))
_FLAG = Rule("true or false", r"(?i)true|false|yes|no|[01tfyn]", (bool,))
_TEXT = Rule("text", r"(?s).*", (str, bytes, os.PathLike))
_NEVER = r"(?!)"

# The options redis-py takes from any URL: URL_QUERY_ARGUMENT_PARSERS in
# redis/connection.py, and the connection class's keyword arguments a string can carry
# (redis-py passes any other option on to it).
_RULES: dict[str, Rule] = {
    "db": Rule("a db number, at most 9 digits", _DB_DIGITS, (int, str)),
    "socket_timeout": _SECONDS,
    "socket_connect_timeout": _SECONDS,
    "socket_read_size": _COUNT,
    "retry_on_timeout": _FLAG,
    "max_connections": _COUNT,
    "health_check_interval": _WHOLE,
    "protocol": Rule("2 or 3", "[23]", (int, str)),
    "legacy_responses": _FLAG,
    # The registry's names and templates are UTF-8: what another encoding writes, no pump reads.
    "encoding": Rule("utf-8 (in any spelling), the registry's encoding", _TEXT.pattern),
    "encoding_errors": Rule("a codec error handler, such as strict", _TEXT.pattern),
    # redis-py passes this one on as a string: "false" would turn it on.
    "decode_responses": Rule("true, or left out for false", r"(?i)true|yes|[1ty]", (bool,)),
    # In redis-py's parsers, but unusable: a list of letters, a BlockingConnectionPool's.
    "retry_on_error": Rule(
        "given to the client: it takes exception classes",
        _NEVER,
        (list, tuple, set, frozenset),
    ),
    "timeout": Rule("left out: it is a BlockingConnectionPool option", _NEVER, ()),
    **dict.fromkeys(("username", "password", "client_name", "lib_name", "lib_version"), _TEXT),
}
_TCP_RULES: dict[str, Rule] = {"socket_keepalive": _FLAG}
_TLS_TEXTS = ("keyfile", "certfile", "ca_certs", "ca_path", "ca_data", "password", "ciphers")
_TLS_RULES: dict[str, Rule] = {
    "ssl_check_hostname": _FLAG,
    "ssl_cert_reqs": Rule(
        "none, optional or required (or CERT_NONE, CERT_OPTIONAL, CERT_REQUIRED), any case",
        r"(?i)(cert_)?(none|optional|required)",
        (str, ssl.VerifyMode),
    ),
    "ssl_min_version": Rule(
        "an ssl.TLSVersion number, such as 771",
        "|".join(str(version.value) for version in ssl.TLSVersion),
        (int,),
    ),
    # redis-py parses the verify flags itself, at once: a bad one is a ValueError there.
    **{
        f"ssl_{name}": _TEXT
        for name in (*_TLS_TEXTS, "include_verify_flags", "exclude_verify_flags")
    },
}


# redis-py maps only its lower-case words to `ssl.VerifyMode`; Celery's result backend and
# kombu also take the `ssl` module's names (`CERT_REQUIRED`), which redis-py refuses.
_CERT_REQS_WORDS = ("none", "optional", "required")


def _cert_reqs_word(value: str) -> str:
    """Return the `ssl_cert_reqs` word redis-py takes for `value` in any of its spellings
    (`CERT_REQUIRED`, `Required`); `value` itself when it is none of them."""
    word = value.lower().removeprefix("cert_")
    return word if word in _CERT_REQS_WORDS else value


def _canonical_value(name: str, value: str) -> str:
    """A query option's value as redis-py takes it: `ssl_cert_reqs` in its own spelling."""
    return _cert_reqs_word(value) if name == "ssl_cert_reqs" else value


def _canonical_query(url: str) -> str:
    """Return `url` with its `ssl_cert_reqs` values spelt as redis-py takes them.

    The query is cut where urllib cuts it (after the first '?', up to the first '#'), as
    redis-py reads it; no other character of the URL changes, its password included.
    """
    rest, hash_, fragment = url.partition("#")
    head, mark, query = rest.partition("?")
    pieces = []
    for piece in query.split("&"):
        name, equals, value = piece.partition("=")
        if equals and unquote_plus(name) == "ssl_cert_reqs":
            word = _cert_reqs_word(unquote_plus(value))
            value = word if word in _CERT_REQS_WORDS else value
        pieces.append(f"{name}{equals}{value}")
    return f"{head}{mark}{'&'.join(pieces)}{hash_}{fragment}"


def _canonical_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """Return the keyword options with a text `ssl_cert_reqs` spelt as redis-py takes it."""
    reqs = options.get("ssl_cert_reqs")
    if isinstance(reqs, str):
        return {**options, "ssl_cert_reqs": _cert_reqs_word(reqs)}
    return dict(options)


def is_utf8_codec(encoding: str) -> bool:
    """Return whether `encoding` names Python's UTF-8 codec, in any spelling (utf8, UTF-8)."""
    try:
        return codecs.lookup(encoding).name == "utf-8"
    except LookupError:
        return False


# Options whose values only a lookup can tell apart (a LookupError: not usable).
_LOOKUPS: dict[str, Callable[[str], bool]] = {
    "encoding": is_utf8_codec,
    "encoding_errors": lambda handler: callable(codecs.lookup_error(handler)),
}


# The multi-host schemes: the scheme of redis-py's each speaks to its servers, its port.
_SENTINEL_SCHEMES = {"redis+sentinel": "redis", "rediss+sentinel": "rediss"}
_CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}
SENTINEL_PORT = 26379
CLUSTER_PORT = 6379
_SENTINEL_RULES: dict[str, Rule] = {"sentinel_username": _TEXT, "sentinel_password": _TEXT}
_CLUSTER_RULES: dict[str, Rule] = {"db": Rule("0: a Redis Cluster has only db 0", "0+", (int, str))}
# One host of a list: a name or IPv4 address, or an IPv6 address in brackets; a port.
_HOST = re.compile(
    r"(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<name>[A-Za-z0-9._-]+))(?::(?P<port>\d{1,5}))?"
)


# Query options redis-py reads from a URL only from a version on: an older one passes their
# text on to a connection that takes no such option, or none as text (a TypeError at the
# first command). With such a redis-py they are unknown options.
_SINCE: dict[str, tuple[int, int]] = {
    "legacy_responses": (8, 0),
    "socket_read_size": (8, 0),
    "ssl_include_verify_flags": (7, 0),
    "ssl_exclude_verify_flags": (7, 0),
}
_REDIS_PY = tuple(int(part) for part in re.findall(r"\d+", redis.__version__)[:2])


def _rules(scheme: str) -> dict[str, Rule]:
    """The query options a URL of `scheme` may hold, with the redis-py installed."""
    base = _SENTINEL_SCHEMES.get(scheme) or _CLUSTER_SCHEMES.get(scheme) or scheme
    rules = dict(_RULES)
    if base != "unix":
        rules.update(_TCP_RULES)
    if base == "rediss":
        rules.update(_TLS_RULES)
    for name, since in _SINCE.items():
        if since > _REDIS_PY:
            rules.pop(name, None)
    if scheme in _SENTINEL_SCHEMES:
        rules.update(_SENTINEL_RULES)
    if scheme in _CLUSTER_SCHEMES:
        rules.update(_CLUSTER_RULES)
    return rules


def _usable(rule: Rule, name: str, value: str) -> bool:
    if name in _LOOKUPS:
        try:
            if not _LOOKUPS[name](value):
                return False
        except LookupError:
            return False
    return re.fullmatch(rule.pattern, value) is not None


def _keyword_usable(rule: Rule, name: str, value: object) -> bool:
    """Return whether redis-py can use `value`, given as the keyword option `name`: one of
    the rule's types, a number or text that passes the rule as its text in a URL would."""
    if value is None:
        return True  # redis-py's "not given"
    if isinstance(value, bool):
        return bool in rule.types and (not value or _usable(rule, name, "true"))
    if not isinstance(value, rule.types):
        return False
    if isinstance(value, enum.Enum):
        return True  # a member of the enum redis-py takes (ssl.TLSVersion, ssl.VerifyMode)
    if isinstance(value, int | float):
        return _usable(rule, name, f"{value:f}" if isinstance(value, float) else str(value))
    if isinstance(value, str):
        return _usable(rule, name, value)
    return True  # bytes, a path, a list of exception classes: taken as they are


@dataclass(frozen=True, slots=True)
class HostsUrl:
    """A Sentinel or Cluster URL, checked: its servers, and what redis-py reads of the rest.

    `url` is a `redis://` (or `rediss://`) URL of the first host with the same user info,
    db and query (but the `sentinel_*` options), for redis-py's own parser.
    """

    scheme: str
    hosts: tuple[tuple[str, int], ...]
    url: str
    master: str  # the Sentinel's master name; "" for a cluster
    sentinel: dict[str, str]  # the sentinels' username/password, as given


def parse_hosts_url(url: str) -> HostsUrl:
    """Check a `redis+sentinel://` or `redis+cluster://` URL; `ConfigError` if it is malformed.

    The URL is cut by hand: urllib reads one host only. The user info runs to the last '@'
    before the first '/', '?' or '#'; any '@' after them means a password holds one of
    those unescaped, and the URL is refused without a word of it.
    """
    scheme, _, after = url.partition("://")
    sentinel = scheme in _SENTINEL_SCHEMES
    base = _SENTINEL_SCHEMES.get(scheme) or _CLUSTER_SCHEMES[scheme]
    malformed = MALFORMED_SENTINEL if sentinel else MALFORMED_CLUSTER
    netloc = re.match(r"[^/?#]*", after)
    assert netloc is not None  # the pattern matches any text
    rest = after[netloc.end() :]
    userinfo, at, hostlist = netloc.group().rpartition("@")
    if "@" in rest:
        raise ConfigError(malformed)
    rest = rest.partition("#")[0]  # redis-py ignores a fragment
    hosts = []
    for item in hostlist.split(","):
        host = _HOST.fullmatch(item)
        port = int(host["port"] or (SENTINEL_PORT if sentinel else CLUSTER_PORT)) if host else 0
        if host is None or not 0 < port < 65_536:
            raise ConfigError(malformed)
        hosts.append((host["v6"] or host["name"], port))
    path, _, query = rest.partition("?")
    segments = path.split("/")[1:]
    if sentinel:
        master = unquote(segments[0]) if segments else ""
        db = segments[1] if len(segments) > 1 else ""
        if not master or len(segments) > 3 or not re.fullmatch(f"({_DB_DIGITS})?", db):
            raise ConfigError(malformed)
        if len(segments) == 3 and segments[2]:  # only a trailing '/' may follow the db
            raise ConfigError(malformed)
    else:
        master, db = "", "".join(segments)
        if len(segments) > 1 or not re.fullmatch(f"({_DB_DIGITS})?", db):
            raise ConfigError(malformed)
        if db.strip("0"):
            raise ConfigError(CLUSTER_DB)
    _check_query(scheme, query, secret=bool(at))
    kept = urlencode(
        [(k, _canonical_value(k, v)) for k, v in parse_qsl(query) if k not in _SENTINEL_RULES]
    )
    first, first_port = hosts[0]
    shown = f"[{first}]" if ":" in first else first
    canonical = f"{base}://{userinfo}{at}{shown}:{first_port}{'/' + db if db else ''}"
    return HostsUrl(
        scheme=scheme,
        hosts=tuple(hosts),
        url=f"{canonical}?{kept}" if kept else canonical,
        master=master,
        sentinel={
            k[len("sentinel_") :]: v[0] for k, v in parse_qs(query).items() if k in _SENTINEL_RULES
        },
    )


def check_url(url: str) -> None:
    """Raise `ConfigError` unless `url` is a Redis URL whose query options redis-py can use."""
    scheme = url.partition("://")[0]
    if scheme in _SENTINEL_SCHEMES or scheme in _CLUSTER_SCHEMES:
        parse_hosts_url(url)
        return
    if scheme not in ("redis", "rediss", "unix"):  # the first check of redis-py's parse_url
        raise ConfigError(MALFORMED)
    try:
        parts = urlsplit(url)
    except ValueError:  # an unclosed '[' of an IPv6 host
        raise ConfigError(MALFORMED) from None  # not chained: the cause may quote the password
    # redis-py reads the path as the db and, when it is not a number, quietly uses db 0.
    if scheme != "unix" and not re.fullmatch(f"/?({_DB_DIGITS})?/?", unquote(parts.path)):
        raise ConfigError(DB_PATH)
    _check_query(scheme, parts.query, secret="@" in url)


def _check_query(scheme: str, query: str, *, secret: bool) -> None:
    """Raise `ConfigError` unless redis-py can use every option of `query`.

    `secret`: the URL holds a password, so no option is named (it may be a piece of it).
    """
    rules = _rules(scheme)
    # As redis-py reads the query: the first value of each option, blank ones ignored.
    given = {name: values[0] for name, values in parse_qs(query).items()}
    for name, value in given.items():
        if name not in rules:
            secret = secret or any(n.lower().endswith("password") for n in given)
            shown = " (not named, as the URL holds a password)" if secret else f" {name!r}"
            taken = sorted(n for n, rule in rules.items() if rule.pattern != _NEVER)
            since = _SINCE.get(name)
            newer = (
                f" from redis-py {since[0]}.{since[1]} on (this is {redis.__version__})"
                if since is not None and not secret
                else ""
            )
            raise ConfigError(
                f"invalid Redis URL: unknown query option{shown}{newer}; {scheme}:// URLs "
                f"take {', '.join(taken)} (a '?' or '#' in a password is written %3F, %23)"
            )
        if not _usable(rules[name], name, value):
            raise ConfigError(f"invalid Redis URL: query option {name} must be {rules[name].words}")


# What the client of each scheme takes besides its classes' keyword arguments: options its
# pool reads out of the connection options.
_POOL_OPTIONS = frozenset({"cache", "cache_config"})
_FROM_URL_OPTIONS = frozenset({"single_connection_client"})  # `Redis.from_url`'s own
_SENTINEL_POOL_OPTIONS = frozenset({"check_connection"})  # `SentinelConnectionPool`'s
# The connection class redis-py makes for a URL of each scheme, unless given another.
_CONNECTIONS: dict[str, type] = {
    "redis": redis.Connection,
    "rediss": redis.SSLConnection,
    "unix": redis.UnixDomainSocketConnection,
    "redis+sentinel": SentinelManagedConnection,
    "rediss+sentinel": SentinelManagedSSLConnection,
}
# Given by `client_from_url` itself: a keyword option of the same name would clash.
_SET_HERE = frozenset(
    {"redis_class", "ssl", "is_master", "service_name", "sentinel_manager", "url", "startup_nodes"}
)


def _init_options(*classes: type) -> set[str]:
    """Return the keyword arguments the `__init__` of `classes` (and of their bases) name."""
    named = set()
    for cls in classes:
        for base in cls.__mro__:
            init = base.__dict__.get("__init__")
            if init is None:
                continue
            for parameter in list(inspect.signature(init).parameters.values())[1:]:
                if parameter.kind in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY):
                    named.add(parameter.name)
    return named


@functools.cache
def _keyword_options(scheme: str, connection_class: type | None) -> frozenset[str]:
    """Return the keyword options redis-py's client for a `scheme` URL takes: read from the
    signatures of its client, pool and connection classes (they change between versions)."""
    if scheme in _CLUSTER_SCHEMES:
        allowed = set(redis.cluster.REDIS_ALLOWED_KEYS) - set(redis.cluster.KWARGS_DISABLED_KEYS)
        named = _init_options(RedisCluster) | allowed
    elif scheme in _SENTINEL_SCHEMES:
        connection = connection_class or _CONNECTIONS[scheme]
        named = _init_options(SentinelConnectionPool, connection)
        named |= {"connection_pool_class"} | _SENTINEL_POOL_OPTIONS | _POOL_OPTIONS
    else:
        connection = connection_class or _CONNECTIONS[scheme]
        named = _init_options(redis.ConnectionPool, connection)
        named |= _FROM_URL_OPTIONS | _POOL_OPTIONS
    return frozenset(named - _SET_HERE)


def _check_options(scheme: str, options: Mapping[str, Any]) -> None:
    """Raise `ConfigError` unless redis-py's client for a `scheme` URL takes every keyword
    option as given: a name it knows, and a value it can use (an option a URL may hold too is
    checked by the same rule as there). No value is shown: it may be a password."""
    chosen = options.get("connection_class")
    if chosen is not None and not isinstance(chosen, type):
        raise ConfigError("invalid Redis client option: connection_class must be a class")
    known = _keyword_options(scheme, chosen)
    rules = _rules(scheme)
    for name, value in options.items():
        if name not in known:
            client = "redis.cluster.RedisCluster" if scheme in _CLUSTER_SCHEMES else "redis.Redis"
            raise ConfigError(
                f"invalid Redis client option: redis-py's client for a {scheme}:// URL takes "
                f"no option {name!r} (see the keyword arguments of {client})"
            )
        rule = rules.get(name)
        if rule is not None and not _keyword_usable(rule, name, value):
            raise ConfigError(f"invalid Redis client option: {name} must be {rule.words}")


# The schemes that speak TLS, by the plain scheme of each (`tls_url`).
_TLS_SCHEMES = {
    "redis": "rediss",
    "redis+sentinel": "rediss+sentinel",
    "redis+cluster": "rediss+cluster",
}


def tls_url(url: str) -> str:
    """Return `url` on TLS: a `redis://` (`redis+sentinel://`, `redis+cluster://`) URL as
    `rediss://` (`rediss+...`), as a Celery broker with `broker_use_ssl` speaks TLS whatever
    its URL's scheme; a `rediss` URL as given. `ConfigError` for a `unix://` URL (a Unix
    socket has no TLS) or a malformed one."""
    scheme, separator, rest = url.partition("://")
    if scheme in _TLS_SCHEMES.values():
        return url
    if scheme == "unix":
        raise ConfigError("a unix:// URL has no TLS: name a rediss:// URL, or drop the TLS options")
    if not separator or scheme not in _TLS_SCHEMES:
        raise ConfigError(MALFORMED)
    return f"{_TLS_SCHEMES[scheme]}://{rest}"


def check_tls_options(url: str, options: Mapping[str, Any]) -> None:
    """Raise `ConfigError` unless `options` are TLS options (redis-py's `ssl_*` keyword
    arguments) that its client for `url`, a TLS URL, takes with the values given. No value
    is shown: `ssl_password` is a secret."""
    for name in options:
        if not isinstance(name, str) or not name.startswith("ssl_"):
            raise ConfigError(
                f"{name!r} is not a TLS option: redis-py's are named ssl_* (ssl_ca_certs, "
                "ssl_certfile, ssl_keyfile, ssl_cert_reqs ...)"
            )
    _check_options(url.partition("://")[0], options)


class SentinelRedis(redis.Redis):
    """A `redis.Redis` on the master a Sentinel names; `close()` closes the sentinels' too."""

    def close(self) -> None:
        super().close()
        manager = getattr(self.connection_pool, "sentinel_manager", None)
        for sentinel in getattr(manager, "sentinels", ()):
            sentinel.close()


def client_from_url(url: str, **options: Any) -> redis.Redis | RedisCluster:
    """Return a client for `url`; a malformed URL raises `ConfigError`.

    `redis://`, `rediss://`, `unix://`: `redis.Redis.from_url(url, **options)`.
    `redis+sentinel://`: a `SentinelRedis` on the named master (`Sentinel.master_for`).
    `redis+cluster://`: a `RedisCluster`, built at once (`RegistryUnavailable` when no startup
    node answers). Options in the URL win over `options`, as in redis-py. A keyword option
    redis-py's client does not take, or cannot use, raises `ConfigError` before connecting.
    """
    if not isinstance(url, str):
        raise ConfigError(f"invalid Redis URL: it must be text (str), not {type(url).__name__}")
    if not is_utf8(url):  # else the AUTH or CLIENT SETNAME of the first command fails to encode
        raise ConfigError(NOT_UTF8)
    scheme = url.partition("://")[0]
    if scheme in _SENTINEL_SCHEMES or scheme in _CLUSTER_SCHEMES:
        parsed = parse_hosts_url(url)
        _check_options(scheme, options)
        if scheme in _SENTINEL_SCHEMES:
            return _sentinel_client(parsed, _canonical_options(options))
        return _cluster_client(parsed, _canonical_options(options))
    check_url(url)
    _check_options(scheme, options)
    try:
        return redis.Redis.from_url(_canonical_query(url), **_canonical_options(options))
    except ValueError:
        raise ConfigError(MALFORMED) from None


def _sentinel_client(parsed: HostsUrl, options: dict[str, Any]) -> SentinelRedis:
    try:
        from_url = redis.connection.parse_url(parsed.url)  # type: ignore[no-untyped-call]
    except ValueError:
        raise ConfigError(MALFORMED_SENTINEL) from None
    for key in ("host", "port", "connection_class"):  # the host comes from the sentinels
        from_url.pop(key, None)
    tls = parsed.scheme.startswith("rediss")
    connection = {**options, **from_url}
    # What redis-py gives the sentinels when told nothing (the socket_* options), plus TLS
    # and their own credentials. No retries, as on a client from a redis:// URL: each
    # sentinel is asked in turn, then the caller (the pump) backs off, instead of redis-py
    # retrying every sentinel ten times for seconds per command.
    to_sentinels: dict[str, Any] = {
        "retry": Retry(NoBackoff(), 0),
        **{k: v for k, v in connection.items() if k.startswith("socket_")},
    }
    if tls:
        to_sentinels.update({k: v for k, v in connection.items() if k.startswith("ssl_")})
        to_sentinels["ssl"] = True
    to_sentinels.update(parsed.sentinel)
    # Typed as Any: redis-py before 8.2 leaves Sentinel untyped, 8.2 types it.
    sentinel_class: Any = Sentinel
    manager = sentinel_class(list(parsed.hosts), sentinel_kwargs=to_sentinels)
    client: SentinelRedis = manager.master_for(
        parsed.master, redis_class=SentinelRedis, ssl=tls, **connection
    )
    return client


def _cluster_client(parsed: HostsUrl, options: dict[str, Any]) -> RedisCluster:
    others = [
        ClusterNode(host, port)  # type: ignore[no-untyped-call]
        for host, port in parsed.hosts[1:]
    ]
    try:
        return RedisCluster(url=parsed.url, startup_nodes=others, **options)
    except ValueError:
        raise ConfigError(MALFORMED_CLUSTER) from None
    except (redis.exceptions.RedisClusterException, redis.RedisError) as exc:
        where = ", ".join(f"{host}:{port}" for host, port in parsed.hosts)
        raise RegistryUnavailable(f"cannot reach the Redis Cluster at {where}: {exc}") from exc


# -- showing a URL -------------------------------------------------------------------------

_SECRET_QUERY_KEYS = ("password", "pass", "pw", "secret", "token")


def redact_url(url: str) -> str:
    """Return `url` with any password (in the user info or the query) replaced by `***`.

    Of the user info, everything after '://' up to the LAST '@', only the user name (up to
    its first ':') is shown.
    """
    head, userinfo, rest = split_userinfo(url)
    try:
        if userinfo is None:
            return _redact_query(url)
        shown = _redact_query(head + rest)[len(head) :]
    except ValueError:
        return "<unparseable URL>"
    user, has_password, _ = userinfo.partition(":")
    return f"{head}{user}:***@{shown}" if has_password else f"{head}***@{shown}"


def url_has_password(url: str) -> bool:
    """Whether `url` holds a password: in its user info (`user:password@`, `:password@`)
    or as a `password` query option."""
    _, userinfo, rest = split_userinfo(url)
    if userinfo is not None and userinfo.partition(":")[2]:
        return True
    query = rest.partition("?")[2].partition("#")[0]
    return any(item.partition("=")[0] == "password" for item in query.split("&"))


def split_userinfo(url: str) -> tuple[str, str | None, str]:
    """Split `url` into `scheme://`, the user info (None if there is none) and the rest.

    The user info runs to the LAST '@'. urllib, and so redis-py, end it at the first '/',
    '?' or '#' instead, but a password may hold those unescaped, and no part of it may show.
    """
    scheme, separator, after = url.partition("://")
    userinfo, at, rest = after.rpartition("@")
    if not separator or not at:
        return "", None, url
    return scheme + separator, userinfo, rest


def _redact_query(url: str) -> str:
    """Return `url` with the values of secret query keys replaced by `***` (ValueError if bad)."""
    parts = urlsplit(url)
    pairs = parse_qsl(parts.query, keep_blank_values=True)
    if not any(_secret_key(k) for k, _ in pairs):
        return url
    query = urlencode([(k, "***" if _secret_key(k) else v) for k, v in pairs], safe="*")
    shown = urlunsplit((parts.scheme, parts.netloc, parts.path, query, parts.fragment))
    if not parts.netloc and url.startswith(f"{parts.scheme}://"):  # keep unix:///path as written
        shown = f"{parts.scheme}://" + shown[len(parts.scheme) + 1 :]
    return shown


def _secret_key(key: str) -> bool:
    """Return whether a query option holds a secret (`password`, `sentinel_password` ...)."""
    return key.lower() in _SECRET_QUERY_KEYS or key.lower().endswith("password")


def url_secrets(url: str) -> list[str]:
    """Return the secrets a URL holds (its password, secret query values), to blank out of text."""
    _, userinfo, _ = split_userinfo(url)
    found = []
    if userinfo is not None:
        user, has_password, password = userinfo.partition(":")
        found.append(password if has_password else user)  # "redis://secret@host": in the user
    try:
        query = urlsplit(url).query
    except ValueError:  # redis-py refused the URL, so no message quotes its query
        query = ""
    found += [v for k, v in parse_qsl(query) if _secret_key(k)]
    return [s for s in found if len(s) >= 3]
