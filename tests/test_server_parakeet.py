"""``oasr serve`` on a Parakeet directory (a frame-synchronous family): same routes, same answers as offline."""

from __future__ import annotations

from pathlib import Path

import pytest
from openai import BadRequestError, OpenAI

import oasr
from oasr.serving.app import build_app
from oasr.serving.settings import ServerSettings
from parakeet_reference import build_reference, write_tokenizer
from serving_harness import WAIT_S, running_server, small_engine

JFK = Path(oasr.__file__).parent / "assets" / "jfk.flac"


@pytest.fixture(scope="module", params=["ctc", "tdt"])
def served(request, tmp_path_factory):
    directory = tmp_path_factory.mktemp(f"serve_parakeet_{request.param}")
    build_reference(request.param).save_pretrained(directory)
    write_tokenizer(directory / "tokenizer.json", "<pad>" if request.param == "ctc" else "<blank>")
    engine = small_engine(str(directory))
    try:
        with running_server(build_app(engine, ServerSettings(served_model_name="parakeet"))) as url:
            yield directory, OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=WAIT_S)
    finally:
        engine.shutdown()


def test_transcription_equals_offline(served):
    directory, client = served
    expected = oasr.transcribe(JFK, model=str(directory), device="cpu", dtype="float32")[0]
    assert expected.token_ids, "the random model emits nothing: the comparison could not fail"
    assert client.audio.transcriptions.create(file=(JFK.name, JFK.read_bytes()), model="parakeet").text == expected.text
    verbose = client.audio.transcriptions.create(file=(JFK.name, JFK.read_bytes()), model="parakeet",
                                                 response_format="verbose_json")
    assert (verbose.text, verbose.duration) == (expected.text, expected.duration_s)


def test_options_the_model_cannot_serve_are_refused(served):
    _, client = served
    with pytest.raises(BadRequestError, match="language"):
        client.audio.transcriptions.create(file=(JFK.name, JFK.read_bytes()), model="parakeet", language="en")


# case: (request fields, the field the refusal names, words its message must contain)
REFUSED = {
    "prompt": ({"prompt": "Kennedy"}, "prompt", "takes no text prompt"),
    "streamed prompt": ({"prompt": "Kennedy", "stream": True}, "prompt", "takes no text prompt"),
    "sampling": ({"temperature": 0.6}, "temperature", "'temperature' must be 0"),
    "word timestamps": ({"response_format": "verbose_json", "timestamp_granularities": ["word"]},
                        "timestamp_granularities", "no word timestamps"),
    "segment timestamps": ({"response_format": "verbose_json", "timestamp_granularities": ["segment"]},
                           "timestamp_granularities", "no segment timestamps"),
}  # beam_size is no longer among them: CTC, RNN-T and TDT all search (test_beam_search_equals_offline)


@pytest.mark.parametrize("case", list(REFUSED))
def test_decoding_fields_a_frame_synchronous_model_lacks_are_refused_by_name(served, case):
    directory, client = served
    fields, param, says = REFUSED[case]
    with pytest.raises(BadRequestError) as info:
        client.audio.transcriptions.create(file=(JFK.name, JFK.read_bytes()), model="parakeet", **fields)
    error = info.value.body
    assert (error["param"], error["code"]) == (param, "unsupported_option") and says in error["message"], error
    assert str(directory) not in info.value.response.text  # the model is named as served, not by its path


def test_beam_search_equals_offline(served):
    directory, client = served
    expected = oasr.transcribe(JFK, model=str(directory), device="cpu", dtype="float32", beam_size=4)[0]
    got = client.audio.transcriptions.create(file=(JFK.name, JFK.read_bytes()), model="parakeet",
                                             extra_body={"beam_size": 4})
    assert got.text == expected.text


def test_hotwords_without_a_beam_are_refused_for_what_is_missing(served):
    """CTC's and TDT's hotwords steer their beam searches: without beam_size the 400 asks for it."""
    _, client = served
    with pytest.raises(BadRequestError) as info:
        client.audio.transcriptions.create(file=(JFK.name, JFK.read_bytes()), model="parakeet",
                                           extra_body={"hotwords": "kennedy"})
    error = info.value.body
    assert (error["param"], error["code"]) == ("hotwords", "invalid_value"), error
    assert "give beam_size too" in error["message"], error
