"""``oasr serve --lm / --lexicon / --decoding-graph`` (``oasr.serving.server_decoding``): every transcription the
server makes decodes with the server's search, as the Python API decodes with the same files; the request keeps
its beam width; what does not combine is refused naming the request's field; a model that cannot serve the search,
a missing file and an unreadable one stop the server before it listens."""

from __future__ import annotations

import asyncio

import httpx
import pytest

import oasr
from oasr.cli import main
from oasr.errors import UnsupportedOptionError
from oasr.models.loader import from_pretrained
from oasr.serving.app import build_app
from oasr.serving.server_decoding import ServerDecoding, ServerDecodingClient, preflight, with_server_decoding
from oasr.serving.settings import ServerSettings
from oasr.types import DecodeOptions, Hotword
from parakeet_reference import build_reference, write_tokenizer
from random_word_lm import write_bigram_arpa
from serving_harness import running_server, small_engine, wav_bytes
from speech_data import clips
from test_realtime import API_KEY, as_served, connect, events_until, next_event, pcm16_24k, send_audio, update

CLIP_IDS = ("ps_librivox_0880", "ps_librivox_0890")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("server_decoding_parakeet")
    build_reference("ctc").save_pretrained(directory)
    write_tokenizer(directory / "tokenizer.json", "<pad>")
    return directory


@pytest.fixture(scope="module")
def speech():
    return clips(CLIP_IDS)


@pytest.fixture(scope="module")
def arpa(tmp_path_factory, speech):
    sentences = [c.text.split() for c in speech] + [["the", "cat", "is", "on", "a", "dog"]]
    return write_bigram_arpa(tmp_path_factory.mktemp("lm") / "bigram.arpa", sentences)


def transcribe_over_http(url: str, audio, **fields) -> httpx.Response:
    return httpx.post(f"{url}/v1/audio/transcriptions", files={"file": ("a.wav", wav_bytes(audio), "audio/wav")},
                      data={"model": "parakeet", "response_format": "json", **fields}, timeout=120,
                      headers={"Authorization": f"Bearer {API_KEY}"})


def realtime_turn(url: str, pcm: bytes) -> str:
    """One turn committed by hand in a realtime session -> its completed transcript."""
    async def session() -> str:
        async with connect(url, "ga") as conn:
            await next_event(conn, "ga")
            await update(conn, "ga", turn_detection=None)
            await send_audio(conn, pcm)
            await conn.input_audio_buffer.commit()
            completed = (await events_until(conn, "ga", 1))[-1]
            assert completed["type"].endswith(".completed"), completed
            return completed["transcript"]

    return asyncio.run(session())


def test_the_server_search_takes_the_request_beam_and_refuses_what_does_not_combine(arpa) -> None:
    words = ServerDecoding(lm=str(arpa), lm_weight=1.0, beam_size=6)
    assert words.apply(DecodeOptions()) == DecodeOptions(beam_size=6, lm=str(arpa), lm_weight=1.0)
    assert words.apply(DecodeOptions(beam_size=2)).beam_size == 2
    assert words.apply(DecodeOptions(hotwords=(Hotword("cat"),))).hotwords == (Hotword("cat"),)
    graph = ServerDecoding(decoding_graph="TLG.fst")
    assert graph.apply(DecodeOptions(language=None)) == DecodeOptions(decoding_graph="TLG.fst")
    for refused in (DecodeOptions(beam_size=4), DecodeOptions(beam_size=4, hotwords=(Hotword("cat"),))):
        with pytest.raises(UnsupportedOptionError, match="over its WFST graph"):
            graph.apply(refused)
    with pytest.raises(ValueError, match="needs lm, lexicon or decoding_graph"):
        ServerDecoding()
    with pytest.raises(ValueError, match="does not combine"):
        ServerDecoding(lm=str(arpa), decoding_graph="TLG.fst")


def test_every_transcription_decodes_with_the_server_language_model(model_dir, speech, arpa) -> None:
    """HTTP and a realtime turn answer what the Python API gives with the same file, weights and beam; beam_size
    and hotwords are still the request's; a hotword the lexicon lacks is a 400 naming the field; greedy decoding
    (no server search) answers differently."""
    decoding = ServerDecoding(lm=str(arpa), lm_weight=1.0, word_bonus=0.5, beam_size_token=100000,
                              beam_threshold=50.0, beam_size=4)
    local = from_pretrained(model_dir, device="cpu", dtype="float32")
    kwargs = dict(lm=str(arpa), lm_weight=1.0, word_bonus=0.5, beam_size_token=100000, beam_threshold=50.0)
    expected = [r.text for r in oasr.transcribe([c.audio for c in speech], local, beam_size=4, **kwargs)]
    narrow = oasr.transcribe([speech[0].audio], local, beam_size=1, **kwargs)[0].text
    boosted = oasr.transcribe([speech[0].audio], local, beam_size=4, hotwords="dog:6", **kwargs)[0].text
    assert boosted != expected[0]
    greedy = [r.text for r in oasr.transcribe([c.audio for c in speech], local)]
    assert expected != greedy
    pcm = pcm16_24k(speech[1].audio)
    turn = oasr.transcribe([as_served(pcm)], local, beam_size=4, **kwargs)[0].text
    assert turn != oasr.transcribe([as_served(pcm)], local)[0].text
    engine = small_engine(str(model_dir), mode="thread")
    try:
        app = build_app(engine, ServerSettings(served_model_name="parakeet", decoding=decoding, api_keys=(API_KEY,)))
        asyncio.run(preflight(app.state.serving.engine))
        with running_server(app) as url:
            got = [transcribe_over_http(url, c.audio).json()["text"] for c in speech]
            assert got == expected
            assert transcribe_over_http(url, speech[0].audio, beam_size="1").json()["text"] == narrow
            assert transcribe_over_http(url, speech[0].audio, hotwords="dog:6").json()["text"] == boosted
            assert realtime_turn(url, pcm) == turn
            refused = transcribe_over_http(url, speech[0].audio, hotwords="zebra")
            assert refused.status_code == 400
            assert refused.json()["error"]["param"] == "hotwords"
            assert "the lexicon has no word 'zebra'" in refused.json()["error"]["message"]
    finally:
        engine.shutdown()


def test_every_transcription_decodes_over_the_server_graph(model_dir, speech, tmp_path) -> None:
    pytest.importorskip("kaldifst")
    from oasr.decode.lexicon import Lexicon
    from test_wfst import write_tlg

    local = from_pretrained(model_dir, device="cpu", dtype="float32")
    lexicon = Lexicon.spelled(sorted({w for c in speech for w in c.text.split()}), local.tokenizer)
    graph = write_tlg(tmp_path / "TLG.fst", lexicon, 33, local.model.blank_id)
    expected = [r.text for r in oasr.transcribe([c.audio for c in speech], local, decoding_graph=str(graph))]
    engine = small_engine(str(model_dir), mode="thread")
    try:
        app = build_app(engine, ServerSettings(served_model_name="parakeet", api_keys=(API_KEY,),
                                               decoding=ServerDecoding(decoding_graph=str(graph))))
        with running_server(app) as url:
            assert [transcribe_over_http(url, c.audio).json()["text"] for c in speech] == expected
            refused = transcribe_over_http(url, speech[0].audio, beam_size="4")
            assert refused.status_code == 400 and refused.json()["error"]["param"] == "beam_size"
            assert "over its WFST graph" in refused.json()["error"]["message"]
    finally:
        engine.shutdown()


def test_a_server_search_the_model_or_its_file_cannot_serve_stops_the_server(model_dir, arpa, tmp_path,
                                                                              capsys) -> None:
    engine = small_engine(str(model_dir), mode="thread")
    try:
        with pytest.raises(UnsupportedOptionError, match="decoding_graph"):  # a model without a graph search
            with_server_decoding(_Without(engine, "decoding_graph"), ServerDecoding(decoding_graph="x.fst"), "m")
        unreadable = tmp_path / "lm.bin"
        unreadable.write_bytes(b"neither ARPA text nor a KenLM binary")
        with pytest.raises(UnsupportedOptionError, match="cannot read the language model"):
            asyncio.run(preflight(ServerDecodingClient(engine, ServerDecoding(lm=str(unreadable)))))
        asyncio.run(engine.check(DecodeOptions()))  # the refusal cost the engine nothing
    finally:
        engine.shutdown()
    base = ["serve", "--model", str(model_dir), "--device", "cpu"]
    assert main([*base, "--lm", str(tmp_path / "missing.arpa")]) == 2
    assert "--lm " in capsys.readouterr().err
    assert main([*base, "--lm-weight", "1.0"]) == 2
    assert "--lm-weight needs --lm or --lexicon" in capsys.readouterr().err
    assert main([*base, "--lm", str(arpa), "--decoding-graph", str(arpa)]) == 2
    assert "does not combine" in capsys.readouterr().err


class _Without:
    """An engine client whose model's capability record lacks one option."""

    def __init__(self, engine, option: str) -> None:
        from dataclasses import replace

        self._engine = engine
        capabilities = engine.capabilities
        self.capabilities = replace(capabilities, decode_strategies=tuple(
            s for s in capabilities.decode_strategies if s != "ctc_wfst")) if option == "decoding_graph" else None

    def __getattr__(self, name: str):
        return getattr(self._engine, name)
