"""Broker configuration: Pulsar's broker.conf key names where one exists, merged in layers.

``load_config(file, overrides)`` is the one function that merges the layers, in this order:

    built-in defaults  <  config file (broker.conf syntax: ``key=value``, ``#`` comments)  <  overrides

Every key is declared once in ``SETTINGS`` with its type, default and a line of help. A value
of the wrong type for a declared key is a one-line ``InvalidConfiguration``. Keys that start
with ``spark.`` pass through untouched to the Spark session builder. An empty value (``key=``,
as Pulsar's shipped files are full of) means the default.

A Pulsar ``broker.conf``/``standalone.conf`` is accepted as is: keys of parts compactmq does not
have (BookKeeper, ZooKeeper, the load balancer, functions, ...) are known by name
(``pulsar_conf_keys.txt``, or a prefix in ``IGNORED_PREFIXES``), accepted, and collected in
``Config.ignored_keys`` so that the broker can list them once at start. Relative paths in the
file are left relative: they resolve against the current directory, as in Pulsar.

A key nobody knows never stops the broker either (Pulsar ignores keys it does not know, so a
file written for one Pulsar release works on another): it is collected in
``Config.unknown_keys`` and the broker lists them once at start, each near miss of a key that
would have taken effect with a "did you mean" (``describe_unknown_keys``) -- a typo of an
implemented key is the case that deserves the warning most.

Nothing is read at import time: tests pass plain dicts as ``overrides``.

Code reads a key with ``setting(config, key)`` (or ``int_setting``/``float_setting``/
``bool_setting``): the value set, else the declared default, so no call site writes a default
again; an undeclared key fails loudly there.

The package is split by idea: ``keys`` declares the keys (``SETTINGS``; add new keys there),
``loading`` merges the layers into a ``Config``, ``pulsar_keys`` knows the keys that are not
compactmq's. Import from ``compactmq.config``: every public name is re-exported here.
"""

from .keys import (
    DEFAULT_BROKER_PORT_TLS,
    DEFAULT_WEB_PORT_TLS,
    KEEP_UNTIL_TOMBSTONE,
    PROVIDER_BASIC,
    PROVIDER_TLS,
    PROVIDER_TOKEN,
    PULSAR_AUTHORIZATION_PROVIDER,
    RETENTION_BOUNDED,
    RETENTION_MODES,
    SETTINGS,
    SPARK_DEFAULTS,
    SPARK_PREFIX,
    OptionalInt,
    Setting,
    is_secret_key,
)
from .loading import (
    Config,
    bool_setting,
    config_list,
    float_setting,
    int_setting,
    load_config,
    metrics_need_authentication,
    parse_bool,
    parse_conf_text,
    parse_override,
    setting,
)
from .pulsar_keys import (
    IGNORED_PREFIXES,
    describe_unknown_keys,
    is_ignored_pulsar_key,
    pulsar_conf_keys,
    suggest_key,
)

#: compactmq's version: the one place it is written (pyproject.toml reads it from here; the wire
#: ``server_version``, the admin API and ``compactmq --version`` derive from it)
VERSION = "0.1.0"

__all__ = [
    "DEFAULT_BROKER_PORT_TLS",
    "DEFAULT_WEB_PORT_TLS",
    "IGNORED_PREFIXES",
    "KEEP_UNTIL_TOMBSTONE",
    "PROVIDER_BASIC",
    "PROVIDER_TLS",
    "PROVIDER_TOKEN",
    "PULSAR_AUTHORIZATION_PROVIDER",
    "RETENTION_BOUNDED",
    "RETENTION_MODES",
    "SETTINGS",
    "SPARK_DEFAULTS",
    "SPARK_PREFIX",
    "VERSION",
    "Config",
    "OptionalInt",
    "Setting",
    "bool_setting",
    "config_list",
    "describe_unknown_keys",
    "float_setting",
    "int_setting",
    "is_ignored_pulsar_key",
    "is_secret_key",
    "load_config",
    "metrics_need_authentication",
    "parse_bool",
    "parse_conf_text",
    "parse_override",
    "pulsar_conf_keys",
    "setting",
    "suggest_key",
]
