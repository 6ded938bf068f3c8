"""Schema compatibility, as Pulsar decides it: the strategies and the Avro resolution check.

A topic's *compatibility strategy* says which new schema versions its history accepts
(Pulsar's ``SchemaCompatibilityStrategy`` names; the broker default is ``FULL``):

=========================  ========================================================================
ALWAYS_COMPATIBLE          any schema, of any type
ALWAYS_INCOMPATIBLE        no change at all: only a schema already stored is accepted
BACKWARD                   the new schema can read data written with the latest one
FORWARD                    the latest schema can read data written with the new one
FULL                       both
BACKWARD_TRANSITIVE, ...   the same, against every version in force rather than the latest only
=========================  ========================================================================

"Can read" is Avro's schema resolution (reader schema against writer schema: fields added with
a default, removed fields, type promotions, enum symbols, unions...). It is not re-implemented
here: Apache Avro's own ``avro.compatibility.ReaderWriterCompatibilityChecker`` decides, with
the one difference Pulsar's check has from it: Pulsar validates with Avro's
``SchemaValidatorBuilder``, whose resolving grammar matches two records by their fields and not
by their names (enums and fixed types must still have the same name). So a producer whose
record class was renamed (``User1`` then ``User2``, the Python client's ``Example`` then
``ExampleRequiredDefault``) is accepted when the fields resolve, as on Pulsar. Avro
and JSON schemas are both compared this way (Pulsar's JSON schema definitions are Avro record
schemas). Schemas of other types are compatible with any schema of the same type (Pulsar checks
no more for them), and a change of type is refused unless the strategy is ALWAYS_COMPATIBLE.

Where the strategy comes from: the topic's policy ``schemaCompatibilityStrategy``, else its
namespace's (``UNDEFINED`` counts as unset), else the broker's ``schemaCompatibilityStrategy``.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, Iterable

from ..config import policy_keys
from ..errors import IncompatibleSchema

STRATEGIES = (
    "ALWAYS_INCOMPATIBLE",
    "ALWAYS_COMPATIBLE",
    "BACKWARD",
    "FORWARD",
    "FULL",
    "BACKWARD_TRANSITIVE",
    "FORWARD_TRANSITIVE",
    "FULL_TRANSITIVE",
)
DEFAULT_STRATEGY = "FULL"
UNDEFINED = "UNDEFINED"  # the namespace policy's "not set" value in Pulsar

# Policy keys (Pulsar's REST path names) and the broker.conf keys they default to: declared in
# config.policy_keys
STRATEGY_KEY = policy_keys.SCHEMA_COMPATIBILITY_STRATEGY
AUTO_UPDATE_KEY = policy_keys.SCHEMA_AUTO_UPDATE
VALIDATION_KEY = policy_keys.SCHEMA_VALIDATION_ENFORCED
CONFIG_KEYS = {
    key: policy_keys.DEFAULT_SETTINGS[key] for key in (STRATEGY_KEY, AUTO_UPDATE_KEY, VALIDATION_KEY)
}

# Schema.Type wire numbers and Pulsar's SchemaType names (REST bodies use the names).
TYPE_NAMES = {
    0: "NONE",
    1: "STRING",
    2: "JSON",
    3: "PROTOBUF",
    4: "AVRO",
    5: "BOOLEAN",
    6: "INT8",
    7: "INT16",
    8: "INT32",
    9: "INT64",
    10: "FLOAT",
    11: "DOUBLE",
    12: "DATE",
    13: "TIME",
    14: "TIMESTAMP",
    15: "KEY_VALUE",
    16: "INSTANT",
    17: "LOCAL_DATE",
    18: "LOCAL_TIME",
    19: "LOCAL_DATE_TIME",
    20: "PROTOBUF_NATIVE",
}
TYPE_NUMBERS = {name: n for n, name in TYPE_NAMES.items()}
AVRO, JSON_TYPE = 4, 2


class InvalidSchemaData(IncompatibleSchema):
    """A schema definition that cannot be parsed (Pulsar answers 422 over HTTP)."""

    http_status = 422


def check_strategy(name: Any) -> str:
    """``name`` as a strategy, or ValueError listing the valid ones."""
    if isinstance(name, str) and name.strip().upper() in STRATEGIES + (UNDEFINED,):
        return name.strip().upper()
    raise ValueError(f"unknown schema compatibility strategy {name!r}: use one of {', '.join(STRATEGIES)}")


@lru_cache(maxsize=256)
def _parse(data: bytes) -> Any:
    import avro.errors
    import avro.schema

    try:
        return avro.schema.parse(data.decode("utf-8"))
    except (ValueError, avro.errors.AvroException) as e:  # JSON and Unicode errors are ValueErrors
        raise InvalidSchemaData(f"invalid schema definition: {e}") from None


def validate(type_: int, data: bytes) -> None:
    """Raise InvalidSchemaData when an Avro schema definition does not parse."""
    if type_ == AVRO:
        _parse(bytes(data))


def _comparable(type_: int, data: bytes) -> bool:
    """Whether resolution rules apply: Avro, and JSON whose definition is an Avro schema (older
    clients wrote other JSON-schema dialects; Pulsar compares those by type alone)."""
    if type_ == AVRO:
        return True
    if type_ != JSON_TYPE:
        return False
    try:
        _parse(bytes(data))
    except InvalidSchemaData:
        return False
    return True


def same(type_: int, a: bytes, b: bytes) -> bool:
    """Whether two definitions of one type are the same schema: equal bytes, or for Avro (and
    Avro-dialect JSON) the same parsed schema whatever the spacing and key order of the text."""
    if a == b:
        return True
    return _comparable(type_, a) and _comparable(type_, b) and _parse(bytes(a)) == _parse(bytes(b))


@lru_cache(maxsize=1)
def _checker_class() -> Any:
    from avro.compatibility import CompatibleResult, ReaderWriterCompatibilityChecker, SchemaType, merge

    class RecordsByFieldsChecker(ReaderWriterCompatibilityChecker):
        """Avro's checker, records resolved by their fields whatever their names (see the
        module docstring: Pulsar's resolving-grammar check)."""

        def calculate_compatibility(self, reader: Any, writer: Any, location: list[str]) -> Any:
            if reader.type == writer.type == SchemaType.RECORD:
                return merge(
                    CompatibleResult, self.check_reader_writer_record_fields(reader, writer, location)
                )
            return super().calculate_compatibility(reader, writer, location)

    return RecordsByFieldsChecker


def _can_read(reader: bytes, writer: bytes) -> tuple[bool, str]:
    from avro.compatibility import SchemaCompatibilityType

    result = _checker_class()().get_compatibility(_parse(reader), _parse(writer))
    if result.compatibility is SchemaCompatibilityType.compatible:
        return True, ""
    return False, "; ".join(str(m) for m in result.messages) or "not compatible"


def check(
    strategy: str, existing: Iterable[tuple[int, bytes]], new: tuple[int, bytes], topic: str = ""
) -> None:
    """Raise IncompatibleSchema unless ``new`` (type, data) may follow ``existing`` (the
    versions in force, oldest first) under ``strategy``."""
    history = list(existing)
    if not history or strategy == "ALWAYS_COMPATIBLE":
        return
    new_type, new_data = new
    if strategy == "ALWAYS_INCOMPATIBLE":
        raise IncompatibleSchema(
            f"topic {topic}: schema compatibility strategy is ALWAYS_INCOMPATIBLE; "
            "only a schema already registered is accepted"
        )
    against = history if strategy.endswith("_TRANSITIVE") else history[-1:]
    base = strategy.replace("_TRANSITIVE", "")
    for old_type, old_data in reversed(against):
        if old_type != new_type:
            raise IncompatibleSchema(
                f"topic {topic}: a {TYPE_NAMES.get(new_type, new_type)} schema is incompatible with the "
                f"{TYPE_NAMES.get(old_type, old_type)} schema in force (strategy {strategy})"
            )
        if not (_comparable(new_type, new_data) and _comparable(old_type, old_data)):
            continue
        checks = []
        if base in ("BACKWARD", "FULL"):
            checks.append(
                ("the new schema cannot read data written with an existing one", new_data, old_data)
            )
        if base in ("FORWARD", "FULL"):
            checks.append(
                ("an existing schema cannot read data written with the new one", old_data, new_data)
            )
        for what, reader, writer in checks:
            ok, why = _can_read(bytes(reader), bytes(writer))
            if not ok:
                raise IncompatibleSchema(
                    f"topic {topic}: incompatible schema under {strategy}: {what}: {why}"
                )
