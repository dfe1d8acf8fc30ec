"""Registry URLs: `client_from_url` checks a Redis URL up front, then connects with redis-py.

redis-py checks a URL's query options only on the first connection, where an unknown one
is a `TypeError` and `socket_timeout=-1` a `ValueError`. Here they are checked before
anything connects, and a bad URL is a `ConfigError` whose message never holds the URL's
text: redis-py's own messages quote URL parts, and a password with an unescaped '/', '#',
'?' or '@' in it is split into the host, the path or the query.
"""

from __future__ import annotations

import codecs
import re
import ssl
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qs, urlsplit

import redis

from .errors import ConfigError

__all__ = ["client_from_url"]

MALFORMED = (
    "invalid Redis URL: use redis://, rediss:// or unix://, e.g. "
    "redis://user:password@host:6379/0, with special characters of the password "
    "escaped as %XX"
)

# What a value must be: the words for it, and a pattern it must match in full.
Rule = tuple[str, str]
_SECONDS: Rule = ("a number of seconds above 0", r"(?=.*[1-9])(\d+\.?\d*|\.\d+)")
_COUNT: Rule = ("a whole number above 0", r"0*[1-9]\d*")
_WHOLE: Rule = ("a whole number", r"\d+")
_FLAG: Rule = ("true or false", r"(?i)true|false|yes|no|[01tfyn]")
_TEXT: Rule = ("text", r"(?s).*")
_NEVER = r"(?!)"

# The options redis-py takes from any URL: URL_QUERY_ARGUMENT_PARSERS in
# redis/connection.py, and the connection class's keyword arguments a string can carry
# (redis-py passes any other option on to it).
_RULES: dict[str, Rule] = {
    "db": _WHOLE,
    "socket_timeout": _SECONDS,
    "socket_connect_timeout": _SECONDS,
    "socket_read_size": _COUNT,
    "retry_on_timeout": _FLAG,
    "max_connections": _COUNT,
    "health_check_interval": _WHOLE,
    "protocol": ("2 or 3", "[23]"),
    "legacy_responses": _FLAG,
    "encoding": ("a Python codec, such as utf-8", _TEXT[1]),
    "encoding_errors": ("a codec error handler, such as strict", _TEXT[1]),
    # redis-py passes this one on as a string: "false" would turn it on.
    "decode_responses": ("true, or left out for false", r"(?i)true|yes|[1ty]"),
    # In redis-py's parsers, but unusable: a list of letters, a BlockingConnectionPool's.
    "retry_on_error": ("given to the client: it takes exception classes", _NEVER),
    "timeout": ("left out: it is a BlockingConnectionPool option", _NEVER),
    **dict.fromkeys(("username", "password", "client_name", "lib_name", "lib_version"), _TEXT),
}
_TCP_RULES: dict[str, Rule] = {"socket_keepalive": _FLAG}
_TLS_TEXTS = ("keyfile", "certfile", "ca_certs", "ca_path", "ca_data", "password", "ciphers")
_TLS_RULES: dict[str, Rule] = {
    "ssl_check_hostname": _FLAG,
    "ssl_cert_reqs": ("none, optional or required", "none|optional|required"),
    "ssl_min_version": (
        "an ssl.TLSVersion number, such as 771",
        "|".join(str(version.value) for version in ssl.TLSVersion),
    ),
    # redis-py parses the verify flags itself, at once: a bad one is a ValueError there.
    **{
        f"ssl_{name}": _TEXT
        for name in (*_TLS_TEXTS, "include_verify_flags", "exclude_verify_flags")
    },
}
# Options whose values only a lookup can tell apart.
_LOOKUPS: dict[str, Callable[[str], object]] = {
    "encoding": codecs.lookup,
    "encoding_errors": codecs.lookup_error,
}


def _rules(scheme: str) -> dict[str, Rule]:
    """The query options a URL of `scheme` may hold."""
    rules = dict(_RULES)
    if scheme != "unix":
        rules.update(_TCP_RULES)
    if scheme == "rediss":
        rules.update(_TLS_RULES)
    return rules


def _usable(rule: Rule, name: str, value: str) -> bool:
    if name in _LOOKUPS:
        try:
            _LOOKUPS[name](value)
        except LookupError:
            return False
    return re.fullmatch(rule[1], value) is not None


def check_url(url: str) -> None:
    """Raise `ConfigError` unless `url` is a Redis URL whose query options redis-py can use."""
    scheme = url.partition("://")[0]
    if scheme not in ("redis", "rediss", "unix"):  # the first check of redis-py's parse_url
        raise ConfigError(MALFORMED)
    try:
        query = urlsplit(url).query
    except ValueError:  # an unclosed '[' of an IPv6 host
        raise ConfigError(MALFORMED) from None  # not chained: the cause may quote the password
    rules = _rules(scheme)
    # As redis-py reads the query: the first value of each option, blank ones ignored.
    given = {name: values[0] for name, values in parse_qs(query).items()}
    for name, value in given.items():
        if name not in rules:
            secret = "@" in url or "password" in given
            shown = " (not named, as the URL holds a password)" if secret else f" {name!r}"
            taken = sorted(n for n, (_, pattern) in rules.items() if pattern != _NEVER)
            raise ConfigError(
                f"invalid Redis URL: unknown query option{shown}; {scheme}:// URLs take "
                f"{', '.join(taken)} (a '?' or '#' in a password is written %3F, %23)"
            )
        if not _usable(rules[name], name, value):
            raise ConfigError(f"invalid Redis URL: query option {name} must be {rules[name][0]}")


def client_from_url(url: str, **options: Any) -> redis.Redis:
    """Return `redis.Redis.from_url(url, **options)`; a malformed URL raises `ConfigError`."""
    check_url(url)
    try:
        return redis.Redis.from_url(url, **options)
    except ValueError:
        raise ConfigError(MALFORMED) from None
