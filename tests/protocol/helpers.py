"""Test helpers: complete commands for every BaseCommand type, and the real-client fixtures."""

from __future__ import annotations

import json
from pathlib import Path

from google.protobuf.descriptor import FieldDescriptor

from compactmq.protocol import pulsar_pb2 as pb

FIXTURES = Path(__file__).parent / "fixtures"

_SAMPLE = {
    FieldDescriptor.TYPE_STRING: "s",
    FieldDescriptor.TYPE_BYTES: b"b",
    FieldDescriptor.TYPE_BOOL: True,
    FieldDescriptor.TYPE_DOUBLE: 1.5,
}


def fill_required(msg) -> None:
    """Set every required field (recursively) to a sample value."""
    for field in msg.DESCRIPTOR.fields:
        if not field.is_required:
            continue
        if field.type == FieldDescriptor.TYPE_MESSAGE:
            fill_required(getattr(msg, field.name))
            getattr(msg, field.name).SetInParent()
        elif field.type == FieldDescriptor.TYPE_ENUM:
            setattr(msg, field.name, field.enum_type.values[-1].number)
        else:
            setattr(msg, field.name, _SAMPLE.get(field.type, 7))


def field_for(command_type: int) -> str:
    return next(f.name for f in pb.BaseCommand.DESCRIPTOR.fields if f.number == command_type)


def minimal_command(command_type: int) -> pb.BaseCommand:
    cmd = pb.BaseCommand(type=command_type)
    body = getattr(cmd, field_for(command_type))
    body.SetInParent()
    fill_required(body)
    assert cmd.IsInitialized()
    return cmd


ALL_TYPES = sorted(pb.BaseCommand.Type.values())


def real_client_frames() -> list[dict]:
    """Frames pulsar-client 3.13.0 sent (see the fixture's "about")."""
    data = json.loads((FIXTURES / "pulsar_client_3_13_0.json").read_text())
    return [dict(f, raw=bytes.fromhex(f["hex"])) for f in data["frames"]]
