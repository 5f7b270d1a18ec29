"""``python -m oasr.bench.serve_load`` on a model directory (a tiny Qwen3-ASR): a real server and the offline
engine each answer every request. (The requests name the model as the server lists it, its folder's name; the
offline side gives a non-Whisper model no language.)"""

from __future__ import annotations

import json
import socket

import soundfile as sf

from oasr.bench.serve_load import main
from qwen3_reference import SAMPLE_RATE, audio_batch, make_checkpoint


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_serve_load_on_a_model_directory_answers_every_request(tmp_path, capsys) -> None:
    directory = make_checkpoint(tmp_path / "tiny-qwen3-asr", seed=1)
    rows = []
    for i, samples in enumerate(audio_batch((1.0, 2.7))):
        sf.write(tmp_path / f"clip{i}.wav", samples, SAMPLE_RATE)
        rows.append({"audio": f"clip{i}.wav", "duration_s": len(samples) / SAMPLE_RATE, "text": "", "language": "en"})
    manifest = tmp_path / "manifest.jsonl"
    manifest.write_text("".join(json.dumps(row) + "\n" for row in rows))
    main(["--model", str(directory), "--manifest", str(manifest), "--concurrency", "2", "--requests", "4",
          "--requests-per-client", "2", "--warmup-requests", "0", "--client-processes", "1", "--device", "cpu",
          "--port", str(_free_port())])
    out = capsys.readouterr().out
    summary = json.loads(out[out.index("\n{\n") + 1 : out.index("\n}\n") + 2])  # the pretty-printed summary
    (level,) = summary["server"]
    assert level["requests"] == 4 and level["failures"] == 0, level.get("first_failure")
    assert summary["offline"]["64_concurrent"]["rtfx"] > 0
