"""Models named by Hugging Face Hub id or alias: fetched through huggingface_hub's own client from a local stand-in
of the Hub (``fake_hub``), only the files the format needs, then loaded from the cache like a directory.

The CLI runs in subprocesses, since huggingface_hub reads HF_ENDPOINT, HF_HUB_CACHE and HF_HUB_OFFLINE when it is
imported; the pure parts (id parsing, file selection, resolution order, the catalogue) run in process.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import torch
from transformers import WhisperForConditionalGeneration

import oasr
from aed_reference import make_canary_checkpoint
from fake_hub import FakeHub, FakeRepo, serving
from oasr.bench.peer_transformers import hf_whisper_config
from oasr.cli import main
from oasr.errors import ModelNotFoundError, UnsupportedModelError
from oasr.models import ARCHITECTURES
from oasr.models import loader
from oasr.models.capabilities import capabilities_of
from oasr.models.catalogue import CATALOGUE
from oasr.models.embedded import EMBEDDED_MODELS, resolve_embedded
from oasr.models.hub import HubRef, parse_hub_id, select_files
from parakeet_reference import build_reference, write_tokenizer
from qwen3_reference import make_checkpoint as make_qwen3_checkpoint

ROOT = Path(oasr.__file__).parent.parent
JFK = Path(oasr.__file__).parent / "assets" / "jfk.flac"
# Files of a transformers Whisper repo that OASR does not read: a copy in another precision, other frameworks'
# weights, a model card. None may be fetched.
UNREAD = {"model.fp32-00001-of-00002.safetensors": b"x" * 64, "flax_model.msgpack": b"y" * 64,
          "tf_model.h5": b"z" * 64, "README.md": b"# tiny", "vocab.json": b"{}"}
WHISPER_FILES = ["config.json", "generation_config.json", "model.safetensors", "tokenizer.json"]
PARAKEET_FILES = WHISPER_FILES  # save_pretrained writes a generation_config.json for Parakeet too
NEMO_ARCHIVE = ROOT / "tests" / "data" / "nemo" / "ctc.nemo"  # a real one, built by NeMo (see its README)
TOKEN = "hf_test_token"


def _tiny_whisper(directory: Path, seed: int, max_shard_size: str | None = None) -> Path:
    torch.manual_seed(seed)
    model = WhisperForConditionalGeneration(hf_whisper_config(ARCHITECTURES.get("whisper").tiny_config()))
    model.save_pretrained(directory, **({"max_shard_size": max_shard_size} if max_shard_size else {}))
    shutil.copy(resolve_embedded("tiny.en").directory / "tokenizer.json", directory / "tokenizer.json")
    return directory


def _parakeet_ctc(directory: Path) -> Path:
    build_reference("ctc").save_pretrained(directory)
    write_tokenizer(directory / "tokenizer.json", "<pad>")
    return directory


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hub_checkpoints")
    return {
        "whisper": _tiny_whisper(root / "whisper", seed=0),
        "whisper-v2": _tiny_whisper(root / "whisper-v2", seed=1),
        "whisper-sharded": _tiny_whisper(root / "whisper-sharded", seed=2, max_shard_size="200KB"),
        "parakeet": _parakeet_ctc(root / "parakeet"),
        "canary": make_canary_checkpoint(root / "canary"),
        "qwen3": make_qwen3_checkpoint(root / "qwen3"),
    }


@pytest.fixture(scope="module")
def hub(checkpoints) -> FakeHub:
    files = {name: FakeRepo.from_directory(directory) for name, directory in checkpoints.items()}
    unsupported = {**files["whisper"], "config.json": json.dumps({"model_type": "wav2vec2"}).encode()}
    return FakeHub(repos={
        "org/whisper": FakeRepo({"main": {**files["whisper"], **UNREAD}, "v2": files["whisper-v2"]}),
        "org/sharded": FakeRepo({"main": {**files["whisper-sharded"], **UNREAD}}),
        "org/parakeet": FakeRepo({"main": {**files["parakeet"], **UNREAD}}),
        "org/canary": FakeRepo({"main": files["canary"]}),
        "org/qwen3": FakeRepo({"main": files["qwen3"]}),
        "org/gated": FakeRepo({"main": files["whisper"]}, token=TOKEN),
        "org/nemo-only": FakeRepo({"main": {"parakeet.nemo": NEMO_ARCHIVE.read_bytes(), "README.md": b"# nemo",
                                            "flax_model.msgpack": b"y" * 64}}),
        "org/wav2vec": FakeRepo({"main": unsupported}),
        "org/card-only": FakeRepo({"main": {"README.md": b"# nothing"}}),
    })


@pytest.fixture(scope="module")
def endpoint(hub):
    with serving(hub) as url:
        yield url


def _dead_endpoint() -> str:
    """A loopback URL nothing listens on (the server stopped)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


def oasr_cli(args: list[str], endpoint: str, cache: Path, **env: str) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_"))}
    environment.update(PYTHONPATH=os.pathsep.join([str(ROOT), environment.get("PYTHONPATH", "")]),
                       HF_ENDPOINT=endpoint, HF_HUB_CACHE=str(cache), HF_HOME=str(cache.parent / "hf_home"),
                       HF_HUB_DISABLE_TELEMETRY="1", OMP_NUM_THREADS="1", **env)
    return subprocess.run([sys.executable, "-m", "oasr.cli", *args], env=environment, capture_output=True, text=True,
                          timeout=300)


def transcribe_local(directory: Path, capsys) -> str:
    assert main(["transcribe", str(JFK), "--model", str(directory), "--device", "cpu", "--dtype", "float32"]) == 0
    return capsys.readouterr().out


def snapshot_of(pull_output: str) -> Path:
    """The directory a one-model `oasr pull` printed ("ID: DIRECTORY (FILES)")."""
    return Path(pull_output.split(": ", 1)[1].rsplit(" (", 1)[0])


@pytest.fixture(scope="module")
def pulled(hub, endpoint, tmp_path_factory) -> Path:
    """A cache filled by one `oasr pull` of several repos and revisions, for the tests that read it."""
    cache = tmp_path_factory.mktemp("pulled") / "hub"
    done = oasr_cli(["pull", "org/whisper", "org/whisper@v2", "org/parakeet", "org/canary", "org/qwen3"], endpoint,
                    cache)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count(str(cache)) == 5, done.stdout
    return cache


# --- through the CLI ---------------------------------------------------------------------------------------------


def test_transcribe_fetches_only_what_it_reads_once_and_then_runs_offline(hub, endpoint, checkpoints, tmp_path,
                                                                         capsys):
    cache = tmp_path / "hub"
    expected = transcribe_local(checkpoints["parakeet"], capsys)
    assert expected.strip(), "the random model emits nothing: the comparison could not fail"
    args = ["transcribe", str(JFK), "--model", "org/parakeet", "--device", "cpu", "--dtype", "float32"]
    online = oasr_cli(args, endpoint, cache, TQDM_POSITION="-1")  # progress bars even without a terminal
    assert online.returncode == 0, online.stderr
    assert online.stdout == expected
    assert sorted(hub.downloads("org/parakeet")) == PARAKEET_FILES
    assert "Fetching 4 files" in online.stderr and "Download complete" in online.stderr

    again = oasr_cli(["pull", "org/parakeet"], endpoint, cache)
    assert again.returncode == 0, again.stderr
    assert sorted(hub.downloads("org/parakeet")) == PARAKEET_FILES, "a cached file was fetched again"
    snapshot = snapshot_of(again.stdout)
    assert snapshot.is_relative_to(cache) and sorted(p.name for p in snapshot.iterdir()) == PARAKEET_FILES

    before_offline = len(hub.requests)
    offline = oasr_cli(args, _dead_endpoint(), cache, HF_HUB_OFFLINE="1")  # and no server
    assert offline.returncode == 0, offline.stderr
    assert offline.stdout == expected
    unreachable = oasr_cli(["pull", "org/parakeet"], _dead_endpoint(), cache)  # not offline: the cache, and a warning
    assert unreachable.returncode == 0, unreachable.stderr
    assert snapshot_of(unreachable.stdout) == snapshot and "loading org/parakeet from the cache" in unreachable.stderr
    assert len(hub.requests) == before_offline


def test_a_whisper_repo_fetches_one_weight_file_and_a_revision_its_own(hub, pulled, checkpoints):
    # main and v2, nothing else; the files alike in both are stored once (blobs are named by content)
    assert sorted(hub.downloads("org/whisper")) == sorted([*WHISPER_FILES, "model.safetensors"])
    repo = hub.repos["org/whisper"]
    for revision, directory in (("main", checkpoints["whisper"]), ("v2", checkpoints["whisper-v2"])):
        assert ("GET", f"/org/whisper/resolve/{repo.commit(revision)}/model.safetensors") in hub.requests
        snapshot = pulled / "models--org--whisper" / "snapshots" / repo.commit(revision)
        assert (pulled / "models--org--whisper" / "refs" / revision).read_text() == repo.commit(revision)
        assert (snapshot / "model.safetensors").read_bytes() == (directory / "model.safetensors").read_bytes()
    assert repo.revisions["main"]["model.safetensors"] != repo.revisions["v2"]["model.safetensors"]


def test_every_family_loads_from_the_hub_as_from_its_directory(pulled, checkpoints):
    """Whisper (both revisions), Parakeet, Canary and Qwen3-ASR from the cache: the same weights and config as
    from their directories."""
    script = ("import hashlib, json, sys\n"
              "from oasr.models.loader import from_pretrained\n"
              "def digest(name):\n"
              "    m = from_pretrained(name, device='cpu', dtype='float32')\n"
              "    h = hashlib.sha256(repr(m.config).encode())\n"
              "    for key, tensor in sorted(m.model.state_dict().items()):\n"
              "        h.update(key.encode() + tensor.numpy().tobytes())\n"
              "    return [m.name, m.architecture, h.hexdigest()]\n"
              "print(json.dumps([digest(name) for name in sys.argv[1:]]))\n")
    families = {"org/whisper": "whisper", "org/whisper@v2": "whisper-v2", "org/parakeet": "parakeet",
                "org/canary": "canary", "org/qwen3": "qwen3"}
    environment = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    environment.update(PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(pulled),
                       HF_ENDPOINT=_dead_endpoint(), OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, "-c", script, *families, *(str(checkpoints[f]) for f in families.values())],
                          env=environment, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    digests = json.loads(done.stdout)
    from_hub, from_directories = digests[:len(families)], digests[len(families):]
    assert [name for name, _, _ in from_hub] == list(families)
    assert [d[1:] for d in from_hub] == [d[1:] for d in from_directories]
    assert len({d[2] for d in from_hub}) == len(families), "two checkpoints gave the same weights"


def test_a_nemo_repo_fetches_only_its_archive_and_transcribes_as_the_local_file_then_offline(hub, endpoint, tmp_path,
                                                                                             capsys):
    cache = tmp_path / "hub"
    expected = transcribe_local(NEMO_ARCHIVE, capsys)
    assert expected.strip(), "the tiny archive emits nothing: the comparison could not fail"
    args = ["transcribe", str(JFK), "--model", "org/nemo-only", "--device", "cpu", "--dtype", "float32"]
    online = oasr_cli(args, endpoint, cache)
    assert online.returncode == 0, online.stderr
    assert online.stdout == expected
    assert hub.downloads("org/nemo-only") == ["parakeet.nemo"]
    pulled = oasr_cli(["pull", "org/nemo-only"], endpoint, cache)
    assert pulled.returncode == 0, pulled.stderr
    assert pulled.stdout.strip().endswith("(parakeet.nemo)")
    assert hub.downloads("org/nemo-only") == ["parakeet.nemo"], "the cached archive was fetched again"
    before_offline = len(hub.requests)
    offline = oasr_cli(args, _dead_endpoint(), cache, HF_HUB_OFFLINE="1")
    assert offline.returncode == 0, offline.stderr
    assert offline.stdout == expected
    assert len(hub.requests) == before_offline


def test_a_sharded_checkpoint_fetches_the_shards_its_index_names(hub, endpoint, checkpoints, tmp_path):
    shards = sorted(p.name for p in checkpoints["whisper-sharded"].glob("model-*.safetensors"))
    assert len(shards) > 1
    done = oasr_cli(["pull", "org/sharded"], endpoint, tmp_path / "hub")
    assert done.returncode == 0, done.stderr
    expected = ["config.json", "generation_config.json", "model.safetensors.index.json", *shards, "tokenizer.json"]
    assert sorted(hub.downloads("org/sharded")) == sorted(expected)
    assert sorted(p.name for p in snapshot_of(done.stdout).iterdir()) == sorted(expected)


def test_a_gated_repo_loads_with_its_token(hub, endpoint, tmp_path):
    done = oasr_cli(["pull", "org/gated"], endpoint, tmp_path / "hub", HF_TOKEN=TOKEN)
    assert done.returncode == 0, done.stderr
    assert sorted(hub.downloads("org/gated")) == WHISPER_FILES


# case: (model, extra environment, endpoint dead?, words the message must hold)
REFUSED = {
    "unknown repo": ("org/missing", {}, False, ["has no model repo org/missing", "HF_TOKEN"]),
    "unknown revision": ("org/whisper@nope", {}, False, ["org/whisper has no revision 'nope'"]),
    "gated": ("org/gated", {}, False, ["org/gated is gated", "accept its terms", "HF_TOKEN"]),
    "wrong token": ("org/gated", {"HF_TOKEN": "hf_wrong"}, False, ["org/gated is gated", "HF_TOKEN"]),
    "unreachable": ("org/whisper", {}, True, ["cannot reach the Hub", "HF_HUB_OFFLINE=1", "oasr pull org/whisper"]),
    "offline, not cached": ("org/whisper", {"HF_HUB_OFFLINE": "1"}, False,
                            ["org/whisper is not in the cache", "HF_HUB_OFFLINE", "oasr pull org/whisper"]),
    "unsupported model type": ("org/wav2vec", {}, False, ["model_type 'wav2vec2' is not served", "parakeet_tdt"]),
    "no checkpoint": ("org/card-only", {}, False, ["no checkpoint OASR can read", "NeMo (.nemo)", "qwen3_asr"]),
}


@pytest.mark.parametrize("case", REFUSED)
def test_hub_failures_are_explained_without_a_traceback(case, hub, endpoint, tmp_path):
    model, env, dead, words = REFUSED[case]
    before = len(hub.requests)
    done = oasr_cli(["pull", model], _dead_endpoint() if dead else endpoint, tmp_path / "hub", **env)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr and done.stderr.startswith("oasr: error: ")
    for word in words:
        assert word in done.stderr, (word, done.stderr)
    fetched = [path for method, path in hub.requests[before:] if method == "GET" and "/resolve/" in path]
    assert all(path.endswith("/config.json") for path in fetched), "weights fetched for a refused repo"


def test_transcribe_reports_an_unknown_repo(endpoint, tmp_path):
    done = oasr_cli(["transcribe", str(JFK), "--model", "org/missing"], endpoint, tmp_path / "hub")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "has no model repo org/missing" in done.stderr


def test_serve_answers_with_a_hub_model(pulled, checkpoints):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    environment = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    environment.update(PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(pulled), OMP_NUM_THREADS="1")
    server = subprocess.Popen([sys.executable, "-m", "oasr.cli", "serve", "--model", "org/parakeet", "--port",
                               str(port), "--device", "cpu", "--dtype", "float32", "--engine-mode", "thread"],
                              env=environment, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(1200):
            if server.poll() is not None:
                pytest.fail(f"oasr serve exited: {server.stderr.read()}")
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        answer = httpx.post(f"{url}/v1/audio/transcriptions", files={"file": (JFK.name, JFK.read_bytes())},
                            data={"model": "org/parakeet"}, timeout=120)
        assert answer.status_code == 200, answer.text
        local = oasr.transcribe(JFK, model=str(checkpoints["parakeet"]), device="cpu", dtype="float32")[0]
        assert local.token_ids, "the random model emits nothing: the comparison could not fail"
        assert answer.json()["text"] == local.text
        models = httpx.get(f"{url}/v1/models", timeout=10).json()
        assert [m["id"] for m in models["data"]] == ["org/parakeet"]
    finally:
        server.terminate()
        server.wait(timeout=30)


# --- in process --------------------------------------------------------------------------------------------------


def test_hub_ids_are_parsed_and_paths_are_not():
    assert parse_hub_id("openai/whisper-small") == HubRef("openai/whisper-small")
    assert parse_hub_id("Qwen/Qwen3-ASR-1.7B-hf@v1.0") == HubRef("Qwen/Qwen3-ASR-1.7B-hf", "v1.0")
    for not_an_id in ("./org/name", "/abs/path", "~/models/x", "a/b/c", "tiny.en", "org/..", "org/name@", "a b/c"):
        assert parse_hub_id(not_an_id) is None, not_an_id


def test_file_selection_takes_what_each_converter_reads():
    ref = HubRef("org/x")
    whisper = ["README.md", "config.json", "flax_model.msgpack", "generation_config.json", "model.safetensors",
               "model.fp32-00001-of-00002.safetensors", "pytorch_model.bin", "tokenizer.json", "vocab.json"]
    assert select_files(ref, whisper).files == ("config.json", "tokenizer.json", "model.safetensors",
                                                "generation_config.json")
    pickle_only = ["config.json", "pytorch_model.bin", "tokenizer.json", "tf_model.h5"]
    assert select_files(ref, pickle_only).files == ("config.json", "tokenizer.json", "pytorch_model.bin")
    sharded = ["config.json", "model.safetensors.index.json", "model-00001-of-00002.safetensors", "tokenizer.json"]
    assert select_files(ref, sharded).files == ("config.json", "tokenizer.json", "model.safetensors.index.json")
    assert select_files(ref, ["config.json", "model.bin", "tokenizer.json", "vocabulary.json"]).format == "ctranslate2"
    assert select_files(ref, ["oasr.json", "model.safetensors", "tokenizer.json"]).format == "native"
    assert select_files(ref, ["README.md", "x.nemo"]).files == ("x.nemo",)


def test_file_selection_refuses_what_it_cannot_load():
    ref = HubRef("org/x")
    with pytest.raises(UnsupportedModelError, match="several NeMo archives"):
        select_files(ref, ["a.nemo", "b.nemo"])
    with pytest.raises(UnsupportedModelError, match="no tokenizer.json"):
        select_files(ref, ["config.json", "model.safetensors", "vocab.json", "merges.txt"])
    with pytest.raises(UnsupportedModelError, match="whisper, parakeet_ctc"):
        select_files(ref, ["model.onnx", "README.md"])


def test_resolution_order_is_path_alias_embedded_then_hub(tmp_path, monkeypatch):
    fetched: list[HubRef] = []

    def fake_fetch(ref: HubRef) -> Path:
        fetched.append(ref)
        return tmp_path

    monkeypatch.setattr(loader, "fetch", fake_fetch)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "org" / "name").mkdir(parents=True)
    assert loader.resolve_source("org/name").directory == tmp_path / "org" / "name" and not fetched
    assert loader.resolve_source("tiny.en").name == "tiny.en" and not fetched
    source = loader.resolve_source("large-v3-turbo")
    assert fetched == [HubRef("openai/whisper-large-v3-turbo")] and source.name == "large-v3-turbo"
    assert loader.resolve_source("org/other@v2").name == "org/other@v2" and fetched[-1] == HubRef("org/other", "v2")
    with pytest.raises(ModelNotFoundError, match="Hub id"):
        loader.resolve_source(Path("org") / "absent")  # spelled like a hub id, but a Path is never sent to the Hub
    assert len(fetched) == 2


def test_catalogue_entries_match_their_architectures():
    assert not set(CATALOGUE) & set(EMBEDDED_MODELS), "an alias would hide an embedded model"
    for entry in CATALOGUE.values():
        assert parse_hub_id(entry.hub_id) == HubRef(entry.hub_id), entry.alias
        caps = capabilities_of(ARCHITECTURES.get(entry.architecture))
        assert set(entry.tasks) <= set(caps.tasks), entry.alias
        assert entry.streaming == (caps.streaming is not None), entry.alias
        assert ("word" in entry.timestamps) <= caps.word_timing, entry.alias
        assert ("segment" in entry.timestamps) <= ("timestamps" in caps.served_options), entry.alias
        assert entry.weights in ("transformers", "nemo"), entry.alias


def test_models_lists_aliases_and_keeps_kernels_behind_a_flag(capsys):
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    assert "large-v3-turbo" in out and "openai/whisper-large-v3-turbo" in out and "ORG/NAME[@REVISION]" in out
    assert "kernel gaps" not in out
    assert main(["models", "--kernels"]) == 0
    assert "kernel gaps" in capsys.readouterr().out
