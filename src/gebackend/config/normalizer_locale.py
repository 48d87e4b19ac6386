"""StringNormalizer's locale: a model whose `StringNormalizer` names a locale this machine lacks is served with C.UTF-8.

ONNX Runtime builds a C++ `std::locale` from the node's `locale` attribute (`en_US.UTF-8` when it has none) for the
case change, and fails the whole load when the C library has no such locale: `Failed to construct locale with
name:en_US.UTF-8 … Please, install necessary language-pack-XX and configure locales`. Slim images and containers carry
C.UTF-8 alone (Debian's, the serving image's), so a text pipeline exported from scikit-learn (its vectorizers
normalise with this operator) does not load there, with Triton's onnxruntime backend either. C.UTF-8 (glibc 2.35 and
Debian) holds the full Unicode case mapping (`élan` -> `ÉLAN`): the onnx wheel's six StringNormalizer model cases give
their reference outputs with it. So each such node gets `locale: "C.UTF-8"` in a model copy (config/model_copy.py)
and the load log says which locale was missing and how to install it; with the locale installed nothing changes.
Only models with STRING inputs or outputs are read for it (the operator takes strings).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from pathlib import Path
from typing import Callable

from gebackend.config.onnx_signature import Signature

ORT_DEFAULT_LOCALE = "en_US.UTF-8"  # string_normalizer.cc, on Linux
FALLBACK_LOCALE = "C.UTF-8"
_LC_CTYPE_MASK = 1 << 0  # glibc's LC_CTYPE is category 0


@functools.lru_cache(maxsize=None)
def locale_installed(name: str) -> bool:
    """Whether the C library can make the locale `name` (newlocale: no change to this process's own locale)."""
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    libc.newlocale.restype = ctypes.c_void_p
    libc.newlocale.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p]
    libc.freelocale.argtypes = [ctypes.c_void_p]
    handle = libc.newlocale(_LC_CTYPE_MASK, name.encode(), None)
    if not handle:
        return False
    libc.freelocale(handle)
    return True


def served_locale(path: Path, signature: Signature, log: Callable[[str], None] = lambda m: None,
                  temp_parent: Path | None = None) -> Path:
    """The file the engines load: `path` itself, or a copy whose StringNormalizers name C.UTF-8 instead of a locale
    this machine lacks."""
    if not any(t.dtype.triton == "TYPE_STRING" for t in (*signature.inputs, *signature.outputs)):
        return path
    import onnx
    from onnx import helper

    model = onnx.load(str(path), load_external_data=False)
    missing = set()
    for node in model.graph.node:
        if node.op_type != "StringNormalizer" or node.domain not in ("", "ai.onnx"):
            continue
        attribute = next((a for a in node.attribute if a.name == "locale"), None)
        name = attribute.s.decode() if attribute is not None and attribute.s else ORT_DEFAULT_LOCALE
        if locale_installed(name) or not locale_installed(FALLBACK_LOCALE):
            continue
        missing.add(name)
        if attribute is None:
            node.attribute.append(helper.make_attribute("locale", FALLBACK_LOCALE))
        else:
            attribute.s = FALLBACK_LOCALE.encode()
    if not missing:
        return path
    log(f"StringNormalizer locale {', '.join(sorted(missing))} is not installed here (ONNX Runtime cannot load the model "
        f"with it): served with {FALLBACK_LOCALE}, the same Unicode case mapping; install the locale (Debian: the "
        f"`locales` package and locale-gen) to use it")
    from gebackend.config.model_copy import served_copy

    return served_copy(model, Path(path), temp_parent, "ge-locale-", "with its StringNormalizer locale changed")
