"""Merging the configuration layers into a ``Config``, and reading values the one way.

``load_config(file, overrides)`` merges built-in defaults < a broker.conf-style file < overrides.
Each value of a declared key is coerced to its type (``_coerce``; a wrong one is a one-line
``InvalidConfiguration``); ``spark.*`` keys pass through to the Spark session builder; keys that
are not declared are sorted into ignored Pulsar keys and unknown keys (``pulsar_keys``), never
fatal. ``parse_bool`` and ``config_list`` are the readings other modules share.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import InvalidConfiguration
from .keys import (
    DEFAULT_BROKER_PORT_TLS,
    DEFAULT_WEB_PORT_TLS,
    SETTINGS,
    SPARK_DEFAULTS,
    SPARK_PREFIX,
    OptionalInt,
    Setting,
    is_secret_key,
)
from .pulsar_keys import is_ignored_pulsar_key

_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}


def parse_bool(value: Any, default: bool | None = None) -> bool:
    """The one reading of a boolean from config files, policies and query strings: true/1/yes/on
    and false/0/no/off, any case. Anything else is ``default``, or ``ValueError`` without one."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    if default is not None:
        return default
    raise ValueError(f"expected true or false, got {value!r}")


def _coerce(key: str, value: Any) -> Any:
    setting = SETTINGS[key]
    if setting.type is bool:
        try:
            return parse_bool(value)
        except ValueError:
            raise InvalidConfiguration(f"config {key}={value!r}: expected true or false") from None
    if setting.type is OptionalInt:
        if value is None or (isinstance(value, str) and not value.strip()):
            return None
        setting = Setting(int, None, "")
    if setting.type is float:
        try:
            return float(str(value).strip())
        except ValueError:
            raise InvalidConfiguration(f"config {key}={value!r}: expected a number") from None
    if setting.type is int:
        if isinstance(value, bool):
            raise InvalidConfiguration(f"config {key}={value!r}: expected an integer")
        try:
            return int(str(value).strip())
        except ValueError:
            raise InvalidConfiguration(f"config {key}={value!r}: expected an integer") from None
    return str(value).strip() if not isinstance(value, str) else value.strip()


def setting(config: Mapping[str, Any], key: str) -> Any:
    """The value of the declared ``key``: the one ``config`` holds, else the default declared in
    ``SETTINGS`` -- the one place a default is written, so no call site repeats it. A key that is
    not declared is a ``KeyError`` naming it: a typo fails loudly instead of reading a default.
    ``config`` is any mapping (a ``Config`` holds every declared key; tests pass plain dicts)."""
    declared = SETTINGS.get(key)
    if declared is None:
        raise KeyError(f"{key!r} is not a declared setting (compactmq.config.keys.SETTINGS)")
    return config[key] if key in config else declared.default


def int_setting(config: Mapping[str, Any], key: str) -> int:
    """``setting`` of an integer key, as an ``int`` (an unset optional one is 0)."""
    _check_type(key, (int, OptionalInt))
    return int(setting(config, key) or 0)


def float_setting(config: Mapping[str, Any], key: str) -> float:
    """``setting`` of a number key, as a ``float`` (integer keys read as floats too)."""
    _check_type(key, (float, int))
    return float(setting(config, key))


def bool_setting(config: Mapping[str, Any], key: str) -> bool:
    """``setting`` of a boolean key, read the one way (``parse_bool``)."""
    _check_type(key, (bool,))
    return parse_bool(setting(config, key))


def _check_type(key: str, types: tuple[type, ...]) -> None:
    declared = SETTINGS.get(key)
    if declared is None:
        raise KeyError(f"{key!r} is not a declared setting (compactmq.config.keys.SETTINGS)")
    if declared.type not in types:
        raise TypeError(f"setting {key!r} is declared {declared.type.__name__}")


def metrics_need_authentication(config: Mapping[str, Any]) -> bool:
    """Whether ``/metrics`` requires credentials: ``authenticateMetricsEndpoint`` when set,
    else ``authenticationEnabled`` (its metrics name every tenant's topics)."""
    value = config.get("authenticateMetricsEndpoint")
    if value is None:
        return bool(config.get("authenticationEnabled", False))
    return bool(value)


class Config(Mapping[str, Any]):
    """Merged, validated configuration. Read with ``cfg["key"]``; Spark settings in ``cfg.spark``.

    ``ignored_keys`` lists, in the order first seen, the Pulsar keys that were accepted without
    effect (see the module docstring); ``unknown_keys`` the keys that are neither compactmq's nor
    Pulsar's. The broker logs each list once at start.
    """

    def __init__(
        self,
        values: dict[str, Any],
        spark: dict[str, str],
        ignored_keys: tuple[str, ...] = (),
        unknown_keys: tuple[str, ...] = (),
    ):
        self._values = values
        self.spark = spark
        self.ignored_keys = ignored_keys
        self.unknown_keys = unknown_keys

    def __getitem__(self, key: str) -> Any:
        return self._values[key]

    def __iter__(self):
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def with_overrides(self, overrides: Mapping[str, Any]) -> Config:
        merged = _merge(
            dict(self._values),
            dict(self.spark),
            list(self.ignored_keys),
            overrides,
            list(self.unknown_keys),
        )
        return Config(_apply_aliases(dict(merged)), merged.spark, merged.ignored_keys, merged.unknown_keys)

    @property
    def data_dir(self) -> Path:
        return Path(self["dataDir"])

    def __repr__(self) -> str:
        shown = {k: ("***" if v and is_secret_key(k) else v) for k, v in self._values.items()}
        return f"Config({shown!r}, spark={self.spark!r})"


def config_list(config: Mapping[str, Any], key: str) -> list[str]:
    """A comma-list setting (``superUserRoles=a, b``) as its non-empty, stripped items."""
    return [item.strip() for item in str(config[key] or "").split(",") if item.strip()]


def parse_conf_text(text: str, source: str) -> dict[str, str]:
    """broker.conf syntax: ``key=value`` lines, blank lines and ``#`` comments ignored."""
    out: dict[str, str] = {}
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if "=" not in line:
            raise InvalidConfiguration(f"{source}:{lineno}: expected key=value, got {line!r}")
        key, value = line.split("=", 1)
        out[key.strip()] = value.strip()
    return out


def parse_override(item: str) -> tuple[str, str]:
    """One ``KEY=VALUE`` from the command line."""
    if "=" not in item:
        raise InvalidConfiguration(f"config override {item!r}: expected KEY=VALUE")
    key, value = item.split("=", 1)
    return key.strip(), value


def _merge(
    values: dict[str, Any],
    spark: dict[str, str],
    ignored: list[str],
    layer: Mapping[str, Any],
    unknown: list[str],
) -> Config:
    for key, value in layer.items():
        if key.startswith(SPARK_PREFIX):
            spark[key] = str(value)
        elif key in SETTINGS:
            empty = value is None or (isinstance(value, str) and not value.strip())
            if empty:  # Pulsar's reading: an empty optional port is off, any other key its default
                values[key] = None if SETTINGS[key].type is OptionalInt else SETTINGS[key].default
            else:
                values[key] = _coerce(key, value)
        elif is_ignored_pulsar_key(key):
            if key not in ignored:
                ignored.append(key)
        elif key not in unknown:  # reported at start, never fatal (Pulsar ignores such keys)
            unknown.append(key)
    return Config(values, spark, tuple(ignored), tuple(unknown))


def _apply_aliases(values: dict[str, Any]) -> dict[str, Any]:
    """``tlsEnabled=true`` (deprecated in Pulsar) opens both TLS ports at their old defaults,
    unless a TLS port is set explicitly."""
    no_port = values["brokerServicePortTls"] is None and values["webServicePortTls"] is None
    if values.get("tlsEnabled") and no_port:
        return dict(
            values, brokerServicePortTls=DEFAULT_BROKER_PORT_TLS, webServicePortTls=DEFAULT_WEB_PORT_TLS
        )
    return values


def load_config(file: str | os.PathLike | None = None, overrides: Mapping[str, Any] | None = None) -> Config:
    """Merge defaults, an optional broker.conf-style file and overrides into a ``Config``."""
    values: dict[str, Any] = {k: s.default for k, s in SETTINGS.items()}
    spark = dict(SPARK_DEFAULTS)
    ignored: list[str] = []
    unknown: list[str] = []
    if file is not None:
        path = Path(file)
        try:
            text = path.read_text()
        except OSError as e:
            raise InvalidConfiguration(f"cannot read config file {path}: {e.strerror}") from None
        _merge(values, spark, ignored, parse_conf_text(text, str(path)), unknown)
    if overrides:
        _merge(values, spark, ignored, overrides, unknown)
    return Config(_apply_aliases(values), spark, tuple(ignored), tuple(unknown))
