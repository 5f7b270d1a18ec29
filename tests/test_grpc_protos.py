"""The committed gRPC modules are what the committed .proto files generate: scripts/generate_grpc.sh is run into a
temporary directory with the test extra's grpcio-tools and every generated file compared with the committed one
(regenerating beats a recorded hash of the .proto: it also catches a hand edit of a generated module, or one
left over after its .proto was removed)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROTOS = Path("oasr/serving/grpc/protos")


def generated(directory: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(directory.glob("*_pb2*.py"))}


def test_committed_grpc_modules_equal_what_the_protos_generate(tmp_path):
    done = subprocess.run(["bash", str(ROOT / "scripts/generate_grpc.sh"), str(tmp_path)], cwd=ROOT,
                          env={**os.environ, "PYTHON": sys.executable}, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    fresh = generated(tmp_path / PROTOS)
    assert len(fresh) == 2 * len(list((ROOT / PROTOS).glob("*.proto"))) > 0
    committed = generated(ROOT / PROTOS)
    assert committed.keys() == fresh.keys()
    stale = [name for name in fresh if committed[name] != fresh[name]]
    assert not stale, f"{stale} differ from what the .proto files generate: run scripts/generate_grpc.sh"
