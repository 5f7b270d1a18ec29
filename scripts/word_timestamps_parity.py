"""Word times against openai-whisper's transcribe(word_timestamps=True) on every English clip <= 30 s.

    PYTHONPATH=. python scripts/word_timestamps_parity.py tiny.en [--no-timestamps]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from openai_whisper_reference import compare_word_timestamps, openai_whisper_from  # noqa: E402
from speech_data import audio_path, english_short  # noqa: E402

from oasr.audio import load_audio  # noqa: E402
from oasr.models.loader import from_pretrained  # noqa: E402


def main() -> None:
    name = sys.argv[1] if len(sys.argv) > 1 else "tiny.en"
    loaded = from_pretrained(name, device="cpu", dtype="float32", keep_checkpoint=True)
    reference = openai_whisper_from(loaded, loaded.checkpoint.state_dict)
    comparisons: dict = {}
    for entry in english_short():
        audio = load_audio(audio_path(entry), channel=entry.get("channel"))
        compare_word_timestamps(loaded, reference, audio, comparisons, timestamps="--no-timestamps" not in sys.argv)
    for kind, c in comparisons.items():
        print(f"{kind}: {c.num_words} words, {c.num_within} within 0.1 s ({c.fraction_within:.2%}), "
              f"{c.num_exact} exact, {len(c.text_mismatches)} windows with other words")
        for error, what in sorted(c.worst, reverse=True)[:5]:
            print(f"  {error:.2f} s  {what}")


if __name__ == "__main__":
    main()
