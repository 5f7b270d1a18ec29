#!/usr/bin/env bash
# Regenerates the Python modules of the Riva ASR service definitions (oasr/serving/grpc/protos/*.proto) with
# grpcio-tools (in the test extra). The generated *_pb2.py / *_pb2_grpc.py are committed, so that installing
# OASR needs grpcio and protobuf only; tests/test_grpc_protos.py fails when they differ from what this makes.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
OUT=${1:-.}
"$PYTHON" -m grpc_tools.protoc -I . --python_out="$OUT" --grpc_python_out="$OUT" oasr/serving/grpc/protos/*.proto
