"""Zero-shot classification and text-to-image search over a folder of images, with the CN_CLIP ensembles.

    make serve-cnclip          # in another terminal: serves examples/cnclip_repository on :8000 / :8001
    .venv/bin/python examples/cnclip_client.py classify IMAGES --labels 猫,狗,汽车 [--top-k 3]
    .venv/bin/python examples/cnclip_client.py search IMAGES "一只在草地上的猫" [--top-k 5]
        [--protocol http|grpc] [--url HOST:PORT] [--batch-size N] [--template "{}的图片" ...] [--json]

IMAGES are image files or folders of them (*.jpg, *.jpeg, *.png, *.webp). Each file is sent as it is, raw bytes in
a BYTES tensor, to the `cnclip_image` ensemble, which decodes and preprocesses it as cn_clip does and returns its
L2-normalised embedding; labels and queries go as UTF-8 text to `cnclip_text`. Requests carry up to the
ensemble's max_batch_size items (or --batch-size).

classify: every label is put into each prompt template (default cn_clip's `normal_templates`, "{}的图片"; several
--template: cn_clip's prompt ensembling, the mean of the normalised prompt embeddings, normalised again), and each
image gets the softmax over labels of 100 x cosine similarity (CLIP's logit scale, cn_clip's zero-shot
evaluation), printed as its top-k:

    cat.jpg
      1  0.9712  cos=+0.2843  猫

search: the query's embedding against every image's: the top-k images by cosine similarity, with the softmax over
the images of 100 x cosine. Labels and queries are lower-cased and their curly quotes made straight first, as
cn_clip's `_preprocess_text` does. A file the server cannot decode is reported on stderr and left out.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

EXTENSIONS = (".jpg", ".jpeg", ".png", ".webp")
LOGIT_SCALE = 100.0  # CLIP's learned logit scale at the end of training; cn_clip's zero-shot eval multiplies by 100
DEFAULT_TEMPLATE = "{}的图片"  # cn_clip/eval/cvinw_zeroshot_templates.py: normal_templates
PORTS = {"http": 8000, "grpc": 8001}
IMAGE_MODEL, TEXT_MODEL = "cnclip_image", "cnclip_text"


class ClientError(RuntimeError):
    """A problem the user can fix (no server, a missing model, no images): printed without a traceback."""


def preprocess_text(text: str) -> str:
    """cn_clip's eval `_preprocess_text`: lower-case, curly double quotes to straight ones."""
    return text.lower().replace("“", '"').replace("”", '"')


def softmax(logits: np.ndarray) -> np.ndarray:
    shifted = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return shifted / shifted.sum(axis=-1, keepdims=True)


def image_files(paths: list[Path]) -> list[Path]:
    files = []
    for path in paths:
        if path.is_dir():
            files += sorted(p for p in path.iterdir() if p.is_file() and p.suffix.lower() in EXTENSIONS)
        elif path.is_file():
            files.append(path)
        else:
            raise ClientError(f"{path}: no such file or folder")
    if not files:
        raise ClientError(f"no images ({', '.join(EXTENSIONS)}) in {', '.join(map(str, paths))}")
    return files


class Ensembles:
    """The two CN_CLIP ensembles on one server, over HTTP or gRPC."""

    def __init__(self, protocol: str, url: str, batch_size: int | None = None, image_model: str = IMAGE_MODEL,
                 text_model: str = TEXT_MODEL):
        if protocol == "http":
            import tritonclient.http as module
        else:
            import tritonclient.grpc as module
        from tritonclient.utils import InferenceServerException

        self.module, self.errors, self.url, self.protocol = module, InferenceServerException, url, protocol
        self.image_model, self.text_model = image_model, text_model
        self.client = module.InferenceServerClient(url)
        try:
            live = self.client.is_server_live()
        except Exception as exc:  # noqa: BLE001 - refused connection, DNS, timeout: all mean "no server here"
            raise ClientError(f"no Triton server answers {protocol} at {url} ({_reason(exc)}); start one with "
                              "`make serve-cnclip`, or pass --protocol / --url") from None
        if not live:
            raise ClientError(f"the Triton server at {url} is not live yet")
        self.batch = {}
        for model in (image_model, text_model):
            if not self.client.is_model_ready(model):
                raise ClientError(f"model '{model}' is not ready on the server at {url} ({protocol}): serve "
                                  f"examples/cnclip_repository (`make serve-cnclip`), which has the {IMAGE_MODEL} and "
                                  f"{TEXT_MODEL} ensembles")
            if protocol == "grpc":
                config = self.client.get_model_config(model, as_json=True)["config"]
            else:
                config = self.client.get_model_config(model)
            most = int(config.get("max_batch_size") or 1)
            self.batch[model] = max(1, min(batch_size or most, most))

    def close(self) -> None:
        self.client.close()

    def _infer(self, model: str, name: str, output: str, items: list[bytes]) -> np.ndarray:
        tensor = self.module.InferInput(name, [len(items), 1], "BYTES")
        tensor.set_data_from_numpy(np.array([[item] for item in items], dtype=object))
        wanted = [self.module.InferRequestedOutput(output)]  # only the normalised embedding comes back
        return self.client.infer(model, [tensor], outputs=wanted).as_numpy(output).astype(np.float32)

    def embed_images(self, files: list[Path]) -> tuple[list[Path], np.ndarray]:
        """The files the server could decode and their normalised embeddings [n, embed]."""
        kept, rows, step = [], [], self.batch[self.image_model]
        for start in range(0, len(files), step):
            chunk = files[start:start + step]
            payloads = [f.read_bytes() for f in chunk]
            try:
                rows.append(self._infer(self.image_model, "image", "image_features", payloads))
                kept += chunk
                continue
            except self.errors as exc:
                if len(chunk) == 1:
                    print(f"skipped {chunk[0]}: {_reason(exc)}", file=sys.stderr)
                    continue
            for f, payload in zip(chunk, payloads):  # one bad file fails its whole request: find it
                try:
                    rows.append(self._infer(self.image_model, "image", "image_features", [payload]))
                    kept.append(f)
                except self.errors as exc:
                    print(f"skipped {f}: {_reason(exc)}", file=sys.stderr)
        if not kept:
            raise ClientError("the server could decode none of the images")
        return kept, np.concatenate(rows)

    def embed_texts(self, texts: list[str]) -> np.ndarray:
        step = self.batch[self.text_model]
        payloads = [t.encode("utf-8") for t in texts]
        return np.concatenate([self._infer(self.text_model, "text", "text_features", payloads[i:i + step])
                               for i in range(0, len(payloads), step)])


def label_embeddings(ensembles: Ensembles, labels: list[str], templates: list[str]) -> np.ndarray:
    """cn_clip's zero_shot_classifier: per label, the mean of its normalised prompt embeddings, normalised."""
    prompts = [preprocess_text(t.format(label)) for label in labels for t in templates]
    per_prompt = ensembles.embed_texts(prompts).reshape(len(labels), len(templates), -1)
    mean = per_prompt.mean(axis=1)
    return mean / np.linalg.norm(mean, axis=-1, keepdims=True)


def classify(ensembles: Ensembles, files: list[Path], labels: list[str], templates: list[str], top_k: int) -> list[dict]:
    kept, images = ensembles.embed_images(files)
    cosine = images @ label_embeddings(ensembles, labels, templates).T
    probs = softmax(LOGIT_SCALE * cosine)
    out = []
    for f, p, c in zip(kept, probs, cosine):
        best = np.argsort(-p, kind="stable")[:top_k]
        out.append({"image": f.name, "path": str(f),
                    "top": [{"label": labels[i], "prob": float(p[i]), "cosine": float(c[i])} for i in best]})
    return out


def search(ensembles: Ensembles, files: list[Path], query: str, top_k: int) -> list[dict]:
    kept, images = ensembles.embed_images(files)
    cosine = images @ ensembles.embed_texts([preprocess_text(query)])[0]
    probs = softmax(LOGIT_SCALE * cosine)
    best = np.argsort(-cosine, kind="stable")[:top_k]
    return [{"image": kept[i].name, "path": str(kept[i]), "prob": float(probs[i]), "cosine": float(cosine[i])}
            for i in best]


def _reason(exc: BaseException) -> str:
    text = (exc.message() if hasattr(exc, "message") and callable(exc.message) else str(exc)) or type(exc).__name__
    return " ".join(str(text).split())[:500]


def _labels(args: argparse.Namespace) -> list[str]:
    labels = [x.strip() for x in (args.labels or "").split(",") if x.strip()]
    if args.labels_file:
        labels += [line.strip() for line in args.labels_file.read_text(encoding="utf-8").splitlines() if line.strip()]
    if not labels:
        raise ClientError("no labels: pass --labels 猫,狗 or --labels-file FILE (one label a line)")
    return labels


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("images", type=Path, nargs="+", help="image files or folders")
    common.add_argument("--protocol", choices=("http", "grpc"), default="http")
    common.add_argument("--url", help="host:port (default localhost:8000 for http, localhost:8001 for grpc)")
    common.add_argument("--top-k", type=int, default=3)
    common.add_argument("--batch-size", type=int, help="items per request (default and at most: max_batch_size)")
    common.add_argument("--json", action="store_true", help="print the results as one JSON object")
    common.add_argument("--image-model", default=IMAGE_MODEL, help=f"the image ensemble (default {IMAGE_MODEL})")
    common.add_argument("--text-model", default=TEXT_MODEL, help=f"the text ensemble (default {TEXT_MODEL})")
    sub = parser.add_subparsers(dest="command", required=True)
    p_classify = sub.add_parser("classify", parents=[common], help="zero-shot classification against labels")
    p_classify.add_argument("--labels", help="comma-separated labels, e.g. 猫,狗,汽车")
    p_classify.add_argument("--labels-file", type=Path, help="one label a line")
    p_classify.add_argument("--template", action="append", help=f"prompt template with {{}} (default {DEFAULT_TEMPLATE!r}); "
                            "repeat it to average several prompts per label")
    p_search = sub.add_parser("search", parents=[common], help="the images nearest to a text query")
    p_search.add_argument("query")
    args = parser.parse_args(argv)  # search IMAGES... QUERY: argparse leaves the last positional to the query
    if args.top_k < 1 or (args.batch_size is not None and args.batch_size < 1):
        parser.error("--top-k and --batch-size must be at least 1")
    url = args.url or f"localhost:{PORTS[args.protocol]}"
    try:
        files = image_files(args.images)
        ensembles = Ensembles(args.protocol, url, args.batch_size, args.image_model, args.text_model)
        try:
            if args.command == "classify":
                templates = args.template or [DEFAULT_TEMPLATE]
                bad = [t for t in templates if "{}" not in t]
                if bad:
                    raise ClientError(f"template {bad[0]!r} has no {{}} for the label")
                results = classify(ensembles, files, _labels(args), templates, args.top_k)
            else:
                results = search(ensembles, files, args.query, args.top_k)
        finally:
            ensembles.close()
    except ClientError as exc:
        print(f"cnclip_client: error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({"command": args.command, "protocol": args.protocol, "url": url, "results": results},
                         ensure_ascii=False, indent=1))
    elif args.command == "classify":
        for entry in results:
            print(entry["image"])
            for rank, top in enumerate(entry["top"], 1):
                print(f"  {rank}  {top['prob']:.4f}  cos={top['cosine']:+.4f}  {top['label']}")
    else:
        print(f"query: {args.query}")
        for rank, hit in enumerate(results, 1):
            print(f"  {rank}  {hit['prob']:.4f}  cos={hit['cosine']:+.4f}  {hit['image']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
