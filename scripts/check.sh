#!/usr/bin/env bash
# Static checks, run by .ci/run before the tests (and by hand: bash scripts/check.sh):
#   1. ruff check (the rule set in pyproject.toml) and ruff format --check (the tree is formatted);
#   2. mypy on src/ (the level in pyproject.toml: what the code passes today, to be raised);
#   3. the layer check: no module imports a package on a higher layer (scripts/check_layers.py);
#   4. the committed protocol/pulsar_pb2.py describes exactly protocol/pulsar.proto (the
#      descriptor protoc builds from the .proto equals the one the module registers).
# Each step prints one line when it passes; the script stops at the first that fails.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
python="${PYTHON:-$root/.venv/bin/python}"
bin="$(dirname "$python")"

echo "[check] ruff check"
"$bin/ruff" check --quiet .
echo "[check] ruff format --check"
"$bin/ruff" format --check --quiet .
echo "[check] mypy src/compactmq"
"$bin/mypy" src/compactmq
echo "[check] layers"
PYTHONPATH="$root/src" "$python" scripts/check_layers.py src/compactmq
echo "[check] pulsar_pb2.py matches pulsar.proto"
PYTHONPATH="$root/src" "$python" - <<'PY'
import os
import subprocess
import sys
import tempfile

from google.protobuf import descriptor_pb2

from compactmq.protocol import pulsar_pb2

proto_dir = os.path.join("src", "compactmq", "protocol")
with tempfile.TemporaryDirectory() as tmp:
    out = os.path.join(tmp, "pulsar.desc")
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", f"-I{proto_dir}", f"--descriptor_set_out={out}",
                    "pulsar.proto"], check=True)
    with open(out, "rb") as f:
        fresh = descriptor_pb2.FileDescriptorSet.FromString(f.read()).file[0]
committed = descriptor_pb2.FileDescriptorProto.FromString(pulsar_pb2.DESCRIPTOR.serialized_pb)


def without_json_names(messages):  # a descriptor set carries json_name; generated code does not
    for m in messages:
        for f in m.field:
            f.ClearField("json_name")
        without_json_names(m.nested_type)


without_json_names(fresh.message_type)
if fresh != committed:
    sys.exit("protocol/pulsar_pb2.py is stale: run scripts/gen_proto.sh and commit its output")
print("pulsar_pb2.py matches pulsar.proto")
PY
echo "[check] all passed"
