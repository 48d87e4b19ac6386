"""CN_CLIP's tokenizer: UTF-8 text -> int64 [context_length] token ids, exactly as `cn_clip.clip.tokenize` makes them.

Reproduces cn_clip 1.6.0's `cn_clip/clip/utils.py: tokenize(texts, context_length=52)`, which wraps each text's
`FullTokenizer` ids (`cn_clip/clip/bert_tokenizer.py`, do_lower_case=True) as

    [vocab['[CLS]']] + convert_tokens_to_ids(tokenize(text))[:context_length - 2] + [vocab['[SEP]']]

and zero-pads it to `context_length` (`torch.zeros(..., dtype=torch.long)`; `[PAD]` is id 0).

Who does what here:
- `BasicTokenizer`'s steps run in Python with `unicodedata`, as cn_clip runs them: drop NUL, U+FFFD and control
  characters (Cc, Cf; not \\t \\n \\r), turn whitespace (\\t \\n \\r, Zs) into spaces, pad CJK ideographs with spaces,
  lower-case, NFD and drop non-spacing marks (Mn), split on punctuation (ASCII non-alphanumerics and P*), split on
  whitespace. Each step is a `str` method or a `str.translate` with a per-character table filled on first sight,
  so a text costs a few C-level passes. `tokenizers`' own `BertNormalizer` / `BertPreTokenizer` are not used: their
  Unicode tables are older than Python's (measured with tokenizers 0.23.3 against cn_clip on Python 3.11, every
  code point alone and inside a word: 138,227 differ, e.g. private-use characters, which cn_clip keeps as
  `[UNK]` and they delete, marks and punctuation newer than their tables, and U+2B820..U+2B91F, which their
  CJK ranges leave out), so their ids would differ from cn_clip's on such text.
- `tokenizers`' `WordPiece` model (greedy longest-match-first, `##` continuation, a word of more than 200
  characters is `[UNK]`: cn_clip's `WordpieceTokenizer` settings) turns the words into ids, and its template
  post-processor, truncation and padding do `tokenize`'s wrapping.
"""

from __future__ import annotations

import collections
import unicodedata
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer
from tokenizers.models import WordPiece
from tokenizers.processors import TemplateProcessing

from gebackend.errors import ConfigError

CONTEXT_LENGTH = 52
MAX_INPUT_CHARS_PER_WORD = 200  # cn_clip's WordpieceTokenizer default
_TABLE_LIMIT = 1 << 16  # characters remembered per table; rarer ones are classified again each time


def load_vocab(path: Path) -> dict[str, int]:
    """cn_clip's `load_vocab`: line i (stripped) is token i; a repeated token keeps its last line's index."""
    vocab: dict[str, int] = collections.OrderedDict()
    with open(path, "r", encoding="utf-8") as reader:
        for index, line in enumerate(reader):
            vocab[line.strip()] = index
    return vocab


# --- cn_clip's character classes (bert_tokenizer.py: _is_whitespace, _is_control, _is_punctuation, _is_chinese_char)
def _is_whitespace(char: str) -> bool:
    return char in " \t\n\r" or unicodedata.category(char) == "Zs"


def _is_control(char: str) -> bool:
    return char not in "\t\n\r" and unicodedata.category(char) in ("Cc", "Cf")


def _is_punctuation(char: str) -> bool:
    cp = ord(char)
    if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
        return True
    return unicodedata.category(char).startswith("P")


def _is_chinese_char(cp: int) -> bool:
    return (0x4E00 <= cp <= 0x9FFF or 0x3400 <= cp <= 0x4DBF or 0x20000 <= cp <= 0x2A6DF or 0x2A700 <= cp <= 0x2B73F
            or 0x2B740 <= cp <= 0x2B81F or 0x2B820 <= cp <= 0x2CEAF or 0xF900 <= cp <= 0xFAFF
            or 0x2F800 <= cp <= 0x2FA1F)


def _clean_and_pad_chinese(cp: int) -> str | None:
    """`_clean_text` then `_tokenize_chinese_chars`, for one character (each maps characters independently)."""
    char = chr(cp)
    if cp == 0 or cp == 0xFFFD or _is_control(char):
        return None
    if _is_whitespace(char):
        return " "
    return f" {char} " if _is_chinese_char(cp) else char


def _strip_mark(cp: int) -> str | None:
    """`_run_strip_accents` after NFD: drop non-spacing marks."""
    char = chr(cp)
    return None if unicodedata.category(char) == "Mn" else char


def _pad_punctuation(cp: int) -> str:
    """`_run_split_on_punc`: every punctuation character becomes a word of its own."""
    char = chr(cp)
    return f" {char} " if _is_punctuation(char) else char


class _CharTable(dict):
    """A `str.translate` table that classifies a character the first time it is looked up."""

    def __init__(self, classify):
        super().__init__()
        self._classify = classify

    def __missing__(self, cp: int):
        value = self._classify(cp)
        if len(self) < _TABLE_LIMIT:
            self[cp] = value
        return value


class BasicTokenizer:
    """cn_clip's `BasicTokenizer(do_lower_case=True).tokenize`, one string method or table pass per step.

    cn_clip lower-cases and strips accents per whitespace-separated token; doing it on the whole cleaned text is
    the same, since no whitespace character is cased or case-ignorable (so `str.lower`'s final-sigma rule sees the
    same neighbours) and NFD never reorders across a space.
    """

    def __init__(self):
        self._clean = _CharTable(_clean_and_pad_chinese)
        self._marks = _CharTable(_strip_mark)
        self._punctuation = _CharTable(_pad_punctuation)

    def tokenize(self, text: str) -> list[str]:
        text = text.translate(self._clean).lower()
        text = unicodedata.normalize("NFD", text).translate(self._marks)
        return text.translate(self._punctuation).split()


class CnClipTokenizer:
    """Text -> cn_clip's `tokenize` ids: int64 [context_length] per text."""

    def __init__(self, vocab_path: Path, context_length: int = CONTEXT_LENGTH):
        vocab_path = Path(vocab_path)
        try:
            vocab = load_vocab(vocab_path)
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"cannot read the vocabulary {vocab_path}: {exc}") from None
        missing = [t for t in ("[CLS]", "[SEP]", "[UNK]", "[PAD]") if t not in vocab]
        if missing:
            raise ConfigError(f"the vocabulary {vocab_path} lacks {missing}: not a BERT WordPiece vocab.txt")
        if vocab["[PAD]"] != 0:
            raise ConfigError(f"the vocabulary {vocab_path} has [PAD] at id {vocab['[PAD]']}; cn_clip pads with id 0")
        if context_length < 2:
            raise ConfigError(f"context_length must be at least 2 ([CLS] and [SEP]), not {context_length}")
        self.vocab = vocab
        self.context_length = context_length
        self.basic = BasicTokenizer()
        self.wordpiece = Tokenizer(WordPiece(dict(vocab), unk_token="[UNK]", continuing_subword_prefix="##",
                                             max_input_chars_per_word=MAX_INPUT_CHARS_PER_WORD))
        cls, sep = vocab["[CLS]"], vocab["[SEP]"]
        self.wordpiece.post_processor = TemplateProcessing(single="[CLS] $A [SEP]", special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
        self.wordpiece.enable_truncation(max_length=context_length)  # keeps ids[:context_length - 2] and the two specials
        self.wordpiece.enable_padding(length=context_length, pad_id=vocab["[PAD]"], pad_token="[PAD]")

    def words(self, text: str) -> list[str]:
        """cn_clip's BasicTokenizer output for `text` (before WordPiece)."""
        return self.basic.tokenize(text)

    def encode(self, texts: list[str]) -> np.ndarray:
        """int64 [len(texts), context_length]."""
        if not texts:
            return np.zeros((0, self.context_length), dtype=np.int64)
        encodings = self.wordpiece.encode_batch([self.basic.tokenize(t) for t in texts], is_pretokenized=True)
        return np.array([e.ids for e in encodings], dtype=np.int64)
