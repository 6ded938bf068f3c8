#!/usr/bin/env bash
# Regenerate src/compactmq/protocol/pulsar_pb2.py from our pulsar.proto (no .pyi stub: protoc writes
# an enum member named `None` into it, which is not Python, so mypy could not read it).
# The generated module is committed so that running compactmq needs only the protobuf runtime;
# this script needs grpcio-tools (the `test` extra), which bundles a protoc.
# Run it after every edit of pulsar.proto and commit the .proto and the outputs together.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${PYTHON:-$root/.venv/bin/python}"
proto_dir="$root/src/compactmq/protocol"
cd "$proto_dir"
"$python" -m grpc_tools.protoc -I. --python_out=. pulsar.proto
# protoc emits a plain top-level module; nothing else imports it by another name.
"$python" - <<'PY'
from compactmq.protocol import pulsar_pb2
cmd = pulsar_pb2.BaseCommand(type=pulsar_pb2.BaseCommand.PING, ping=pulsar_pb2.CommandPing())
assert pulsar_pb2.BaseCommand.FromString(cmd.SerializeToString()) == cmd
print("pulsar_pb2 regenerated and importable")
PY
