"""Unit tests for gebackend.runtime.strings: BYTES tensors reach the engine as text, and bytes that are no UTF-8 text
are the request's error naming the model, the input and the element."""

from __future__ import annotations

import numpy as np
import pytest

from gebackend.errors import InvalidRequest
from gebackend.runtime.strings import to_engine, to_triton


def test_utf8_bytes_become_text_and_come_back_as_the_same_bytes():
    sent = np.array([["猫 cat".encode(), b"ok"], ["一只鸟".encode(), b""]], dtype=object)
    text = to_engine(sent, "m", "x")
    assert text.tolist() == [["猫 cat", "ok"], ["一只鸟", ""]]
    assert to_triton(text).tolist() == sent.tolist()


def test_numbers_pass_untouched():
    array = np.arange(6, dtype=np.float32).reshape(2, 3)
    assert to_engine(array, "m", "x") is array


@pytest.mark.parametrize("bad", [b"\xff\xfe bad", b"abc\xe4\xb8", b"\xed\xa0\x80"])  # no UTF-8, cut short, a surrogate
def test_bytes_that_are_no_utf8_name_the_model_the_input_and_the_element(bad):
    sent = np.array([[b"fine", b"also fine"], [bad, b"ok"]], dtype=object)
    with pytest.raises(InvalidRequest) as info:
        to_engine(sent, "strings", "text")
    message = str(info.value)
    assert message.startswith("model 'strings', input 'text', element [1, 0]: expected UTF-8 text, got"), message
    assert "not valid UTF-8" in message and "send UTF-8" in message
