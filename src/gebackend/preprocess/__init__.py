"""CN_CLIP's preprocessing served as Triton models: image bytes -> pixels (`image.py`), text -> token ids (`text.py`).

`models.py` says what each preprocessing backend is (its tensors, parameters, and the work per item),
`vocab.py` where the text model finds its vocabulary, and `serving.py` speaks Triton's Python-backend API
for both (auto-complete, per-request errors). The adapter Triton loads is `triton/preprocess_model.py`,
laid out by `gebackend serve` as a backend of each kind's name.
"""
