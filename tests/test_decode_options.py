"""DecodeOptions refuses contradictory options when it is built."""

import pytest

from oasr.types import DecodeOptions


def test_prompt_as_text_and_as_ids_together_is_refused():
    with pytest.raises(ValueError, match="not both"):
        DecodeOptions(prompt="names", prompt_token_ids=(1, 2))


def test_prompt_as_text_or_as_ids_alone_is_accepted():
    assert DecodeOptions(prompt="names").prompt == "names"
    assert DecodeOptions(prompt_token_ids=(1, 2)).prompt_token_ids == (1, 2)
