"""``oasr bench stream`` on the streaming Paraformer: a FunASR folder of the online model's shape written without
funasr, streamed by a few concurrent streams in simulated real time and flat out (tiny shape, CPU, seconds)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from oasr.bench.funasr_models import STREAMING_SHAPES, write_funasr_folder
from oasr.bench.stream import main
from oasr.models.loader import from_pretrained


def test_the_streaming_shape_is_paraformer_zh_streaming(tmp_path: Path) -> None:
    shape = STREAMING_SHAPES["paraformer-zh-streaming"]
    assert (shape.vocab_size, shape.output_size, shape.num_blocks, shape.decoder_blocks) == (8404, 512, 50, 16)
    folder = write_funasr_folder("paraformer-streaming-tiny", tmp_path / "model")
    config = yaml.safe_load((folder / "config.yaml").read_text())
    assert (config["model"], config["encoder"], config["frontend"]) == (
        "ParaformerStreaming", "SANMEncoderChunkOpt", "WavFrontendOnline")
    assert config["encoder_conf"]["input_layer"] == "pe_online" and config["decoder_conf"]["sanm_shfit"] == 5
    loaded = from_pretrained(folder, device="cpu", dtype="float32")
    assert loaded.architecture == "paraformer_streaming"


def test_streams_of_the_streaming_paraformer_report_chunk_latency_and_speed(tmp_path: Path, capsys) -> None:
    out = tmp_path / "report.json"
    main(["--arch", "paraformer-streaming-tiny", "--chunk-ms", "600", "--streams", "3", "--seconds", "1.5",
          "--device", "cpu", "--dtype", "float32", "--json-out", str(out)])
    report = json.loads(out.read_text())
    assert report["arch"] == "paraformer-streaming-tiny" and report["chunk_ms"] == 600 and "peer" not in report
    for mode in ("realtime", "flat_out"):
        (result,) = report[mode]
        assert result["streams"] == 3 and result["tokens"] > 0 and result["rtfx"] > 0
        assert 0 < result["chunk_p50_ms"] <= result["chunk_p99_ms"]
        assert 0 < result["first_partial_p50_ms"] and 0 < result["final_p99_ms"]
    # Real time cannot finish before the audio has been sent: 1.5 s, the last stream's phase after it.
    assert report["realtime"][0]["wall_s"] >= 1.5
    assert '"most_streams_within_budget"' in capsys.readouterr().out


def test_the_streaming_paraformer_has_no_transformers_peer(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["--arch", "paraformer-streaming-tiny", "--peer", "transformers", "--device", "cpu"])
    assert "has no transformers peer" in capsys.readouterr().err


def test_profile_counts_the_steps_of_streams_flat_out(capsys) -> None:
    main(["--arch", "paraformer-streaming-tiny", "--chunk-ms", "600", "--streams", "1", "--seconds", "1.5",
          "--flat-out", "--device", "cpu", "--dtype", "float32", "--profile", "2"])
    err = capsys.readouterr().err
    assert "== profile: 2 streams flat out" in err and "profiled run:" in err
    # 1.5 s in 600 ms chunks is three chunks a stream; both streams ride each step, and a last step closes them.
    steps = re.search(r"^(\d+) steps$", err, re.MULTILINE)
    assert steps is not None and 3 <= int(steps.group(1)) <= 4
