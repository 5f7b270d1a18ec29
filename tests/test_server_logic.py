"""The serving layer's pure logic: incremental text, window ordering, request fields, admission, settings."""

from __future__ import annotations

import pytest

from oasr.cli import main
from oasr.engine.request import FinishReason, RequestOutput, RequestTimings
from oasr.serving.decoding import IncrementalDetokenizer, OrderedText
from oasr.serving.protocol import APIError, TranscriptionParams, TranslationParams, validation_error
from oasr.serving.serving import Admission
from oasr.serving.settings import ServerSettings

MULTI_BYTE = " naïve café — 日本語 🎉 done"


def output(token_ids: list[int], finished: bool = False) -> RequestOutput:
    return RequestOutput("r", list(token_ids), "en", finished, FinishReason.END_OF_TEXT if finished else None,
                         RequestTimings())


def test_incremental_text_never_emits_half_a_character(tiny_en):
    tokenizer = tiny_en.tokenizer
    ids = tokenizer.encode(MULTI_BYTE)
    # The case under test exists: some prefixes end inside a multi-byte character.
    assert any(tokenizer.decode(ids[:k]).endswith("\ufffd") for k in range(1, len(ids)))
    detokenizer = IncrementalDetokenizer(tokenizer)
    pieces = [detokenizer.update(ids[:k], finished=k == len(ids)) for k in range(1, len(ids) + 1)]
    assert all("\ufffd" not in piece for piece in pieces)
    assert "".join(pieces) == tokenizer.decode(ids) == MULTI_BYTE


def test_incremental_text_flushes_a_broken_tail_when_the_window_ends(tiny_en):
    tokenizer = tiny_en.tokenizer
    ids = tokenizer.encode(" 🎉")[:-1]  # the emoji's last byte never comes
    detokenizer = IncrementalDetokenizer(tokenizer)
    assert detokenizer.update(ids, finished=False) == ""
    assert detokenizer.update(ids, finished=True) == tokenizer.decode(ids)


def test_later_windows_wait_for_earlier_ones_and_text_is_stripped_like_the_result(tiny_en):
    tokenizer = tiny_en.tokenizer
    first, second = tokenizer.encode(" Ask not what your country"), tokenizer.encode(" can do for you. ")
    text = OrderedText(tokenizer, num_windows=2)
    pieces = [
        text.add(1, output(second[:2])),  # window 1 runs ahead: nothing may show before window 0's text
        text.add(0, output(first[:1])),
        text.add(1, output(second, finished=True)),
        text.add(0, output(first[:3])),
        text.add(0, output(first, finished=True)),  # window 0 done: window 1's buffered text follows at once
    ]
    assert pieces[0] == "" and pieces[2] == ""
    assert pieces[1] == "Ask"  # the leading space is stripped, as the final text is
    final = (tokenizer.decode(first) + tokenizer.decode(second)).strip()
    assert "".join(pieces) == final
    assert not pieces[-1].endswith(" ")  # trailing whitespace held back: the result ends without it


def test_blank_windows_at_either_end_leave_no_whitespace(tiny_en):
    tokenizer = tiny_en.tokenizer
    windows = [tokenizer.encode(t) for t in (" ", " Hello", " ", " world", " ", "")]
    text = OrderedText(tokenizer, num_windows=len(windows))
    pieces = [text.add(i, output(ids, finished=True)) for i, ids in enumerate(windows)]
    assert "".join(pieces) == "".join(tokenizer.decode(ids) for ids in windows).strip() == "Hello  world"


@pytest.mark.parametrize(
    ("fields", "param", "says"),
    [
        ({"model": "m", "temperature": "hot"}, "temperature", "valid number"),
        ({"model": "m", "temperature": "1.5"}, "temperature", "less than or equal to 1"),
        ({"model": "m", "response_format": "subtitles"}, "response_format", "'json'"),
        ({"model": "m", "stream": "maybe"}, "stream", "valid boolean"),
        ({"model": "m", "timestamp_granularities": ["segment", "syllable"]}, "timestamp_granularities", "'word'"),
        ({"model": "m", "keywords": "x"}, "keywords", "Unrecognized request argument supplied: keywords"),
        ({}, "model", "Missing required parameter: 'model'"),
    ],
)
def test_field_errors_name_the_field_and_say_why(fields, param, says):
    with pytest.raises(Exception) as info:
        TranscriptionParams.model_validate(fields)
    error = validation_error(info.value)
    assert (error.status, error.param) == (400, param)
    assert says in error.message


def test_translation_takes_no_stream_or_granularities():
    # ``language`` it takes (OASR's extension: models that cannot detect the spoken language, as Canary).
    assert TranslationParams.model_validate({"model": "m", "language": "de"}).language == "de"
    for field in ("stream", "timestamp_granularities"):
        with pytest.raises(Exception) as info:
            TranslationParams.model_validate({"model": "m", field: "x"})
        assert validation_error(info.value).message == f"Unrecognized request argument supplied: {field}"


def test_form_values_are_coerced_from_text():
    params = TranscriptionParams.model_validate({"model": "m", "stream": "true", "temperature": "0",
                                                 "timestamp_granularities": ["segment"]})
    assert (params.stream, params.temperature, params.timestamp_granularities) == (True, 0.0, ["segment"])


def test_admission_refuses_past_its_limit_until_a_ticket_is_released():
    admission = Admission(limit=2, retry_after_s=5)
    first, _ = admission.acquire(), admission.acquire()
    with pytest.raises(APIError) as info:
        admission.acquire()
    assert (info.value.status, info.value.headers) == (429, {"Retry-After": "5"})
    first.release()
    first.release()  # every way out may release; only the first counts
    assert admission.num_in_flight == 1
    admission.acquire()
    assert admission.num_in_flight == 2


def test_error_body_has_openai_shape():
    error = APIError(404, "no such model", code="model_not_found", param="model")
    assert error.body() == {"error": {"message": "no such model", "type": "invalid_request_error",
                                      "param": "model", "code": "model_not_found"}}


@pytest.mark.parametrize("bad", [{"max_in_flight": 0}, {"max_upload_bytes": 0}, {"request_timeout_s": 0},
                                 {"max_audio_seconds": -1}, {"api_keys": (" ",)}, {"served_model_name": ""}])
def test_settings_refuse_nonsense(bad):
    with pytest.raises(ValueError):
        ServerSettings(**{"served_model_name": "tiny.en", **bad})


def test_serve_command_refuses_bad_limits_before_loading_a_model(capsys):
    assert main(["serve", "--max-queue", "0"]) == 2
    assert "max_in_flight must be >= 1" in capsys.readouterr().err
