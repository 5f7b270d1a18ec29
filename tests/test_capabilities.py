"""The capability record: one generic option check, and every strategy an architecture lists is served."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import oasr
from oasr.audio import load_audio
from oasr.decode.ctc_greedy import greedy_ids
from oasr.decode.ctc_prefix_beam import prefix_beam_search
from oasr.engine.config import EngineConfig, SchedulerConfig
from oasr.engine.engine import ASREngine
from oasr.errors import UnsupportedOptionError
from oasr.models import ARCHITECTURES
from oasr.models.capabilities import ModelCapabilities, capabilities_of, check_options, unserved_option
from oasr.models.loader import from_pretrained
from oasr.types import DecodeOptions
from parakeet_reference import build_reference, write_tokenizer

JFK = Path(oasr.__file__).parent / "assets" / "jfk.flac"


@pytest.mark.parametrize(("options", "field"), [
    (DecodeOptions(language="en"), "language"),
    (DecodeOptions(timestamps=True), "timestamps"),
    (DecodeOptions(prompt="names"), "prompt"),
    (DecodeOptions(prompt_token_ids=(3,)), "prompt_token_ids"),
    (DecodeOptions(temperature=0.5), "temperature"),
    (DecodeOptions(min_new_tokens=2), "min_new_tokens"),
    (DecodeOptions(target_language="de"), "target_language"),
    (DecodeOptions(punctuation=False), "punctuation"),
])
def test_the_generic_check_names_the_option_a_frame_synchronous_model_cannot_serve(options, field) -> None:
    capabilities = capabilities_of(ARCHITECTURES.get("parakeet_tdt"))
    assert unserved_option(capabilities, options) == field
    with pytest.raises(UnsupportedOptionError, match=field):
        check_options(capabilities, options, "tdt")


def test_whisper_serves_its_options_and_refuses_the_ones_it_lacks() -> None:
    capabilities = capabilities_of(ARCHITECTURES.get("whisper"))
    served = DecodeOptions(language="de", task="translate", timestamps=True, prompt="x", temperature=0.2,
                           min_new_tokens=1, max_new_tokens=9)
    check_options(capabilities, served, "whisper")
    check_options(capabilities, DecodeOptions(beam_size=4, patience=2.0), "whisper")
    with pytest.raises(UnsupportedOptionError, match="target_language"):
        check_options(capabilities, DecodeOptions(target_language="fr"), "whisper")
    with pytest.raises(UnsupportedOptionError, match="translate"):
        check_options(capabilities_of(ARCHITECTURES.get("parakeet_ctc")), DecodeOptions(task="translate"), "ctc")


def test_a_record_declaring_an_unknown_runner_or_option_is_refused_when_built() -> None:
    with pytest.raises(ValueError, match="runner"):
        ModelCapabilities(runner="magic", decode_strategies=("ctc_greedy",))
    with pytest.raises(ValueError, match="options"):
        ModelCapabilities(runner="frame_sync", decode_strategies=("ctc_greedy",), options=frozenset({"colour"}))


def test_beam_size_on_a_ctc_model_runs_prefix_beam_search(tmp_path: Path) -> None:
    build_reference("ctc").save_pretrained(tmp_path)
    write_tokenizer(tmp_path / "tokenizer.json", "<pad>")
    loaded = from_pretrained(tmp_path, device="cpu", dtype="float32")
    full = load_audio(JFK)
    audio = [full[: 16000 * 4], full[16000 * 3 : 16000 * 9]]
    features, lengths = loaded.features(audio)
    with torch.inference_mode():
        encoded = loaded.model.encode(features, lengths)
        expected, _ = prefix_beam_search(loaded.model.ctc_log_probs(encoded.hidden), encoded.lengths,
                                         loaded.model.blank_id, 4)
        greedy = greedy_ids(loaded.model.ctc_log_probs(encoded.hidden), encoded.lengths, loaded.model.blank_id)
    assert any(expected) and expected != greedy, "beam and greedy agree: the comparison could not fail"
    results = oasr.transcribe(audio, loaded, beam_size=4, batch_size=2)
    assert [r.token_ids for r in results] == expected
    # A beam row and a greedy row in one encode batch each keep their own strategy.
    engine = ASREngine(loaded, EngineConfig(scheduler=SchedulerConfig(max_encode_rows=2)))
    engine.add_request(audio[0], DecodeOptions(beam_size=4), request_id="beam")
    engine.add_request(audio[1], DecodeOptions(), request_id="greedy")
    outputs = {o.request_id: o.token_ids for o in engine.step()}
    assert outputs == {"beam": expected[0], "greedy": greedy[1]}
