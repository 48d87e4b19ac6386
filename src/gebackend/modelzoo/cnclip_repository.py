"""Builds the generated files of the CN_CLIP repository (examples/cnclip_repository): encoders, normalisation, vocab.

The config.pbtxt files are committed; this writes what they need and git ignores (every model's version folder):
  cnclip_image_encoder/1/, cnclip_text_encoder/1/   the encoders, one of
      `cnclip`     the real CN_CLIP encoders (ViT-B/16, RoBERTa-wwm-ext-base; random weights) exported by
                   gebackend.modelzoo.bench_models: needs torch (`pip install -e '.[cnclip]'`)
      `cnclip_l4`  the same cut to 4 of their 12 layers
      `standin`    small stand-ins with CN_CLIP's exact interface (modelzoo/cnclip_standin.py), no torch
      `auto`       (default) `cnclip` when torch imports, else `standin`
    or ONNX files exported with cn_clip's own `cn_clip/deploy/pytorch_to_onnx.py` (`--image-onnx`, `--text-onnx`),
    copied with their external data; a fixed batch dim of 1 (that script exports without dynamic axes) is made
    variable if the graph still runs and agrees row by row at batch 3, else the build says how to re-export;
    each encoder file gains a second output, its features L2-normalised (`image_features`, `text_features`:
    modelzoo/normalized_output.py), so the ensembles need no normalisation step of their own;
  cnclip_text_preprocess/1/vocab.txt               cn_clip's vocabulary, taken out of the cn_clip wheel
  cnclip_image/1/, cnclip_text/1/, cnclip_image_preprocess/1/   empty version folders Triton needs

    python -m gebackend.modelzoo.cnclip_repository REPO [--encoders auto|standin|cnclip|cnclip_l4]
        [--image-onnx FILE] [--text-onnx FILE] [--cache DIR] [--force]
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path
from typing import Callable

import numpy as np
import onnx

from .cnclip_standin import build_cnclip_image_standin, build_cnclip_text_standin, is_standin
from gebackend.files import link_or_copy

from .cnclip_wheel import DEFAULT_CACHE, copy_vocab
from .normalized_output import ensure_normalized_output

ENCODERS = ("auto", "standin", "cnclip", "cnclip_l4")
# encoder folder -> (bench model of the real encoder, stand-in builder, input name, output name, normalised output)
_ENCODER_FOLDERS = {
    "cnclip_image_encoder": ("cnclip_image", build_cnclip_image_standin, "image", "unnorm_image_features", "image_features"),
    "cnclip_text_encoder": ("cnclip_text", build_cnclip_text_standin, "text", "unnorm_text_features", "text_features"),
}
# the ensembles' third step before the encoders gave the normalised features themselves; `make cnclip` wrote its model
_OLD_NORMALIZE = "cnclip_normalize"


def _torch_available() -> bool:
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


def resolve_encoders(encoders: str) -> str:
    if encoders not in ENCODERS:
        raise ValueError(f"--encoders must be one of {', '.join(ENCODERS)}, not {encoders!r}")
    if encoders == "auto":
        return "cnclip" if _torch_available() else "standin"
    return encoders


def _clear_onnx(version: Path) -> None:
    for f in version.iterdir():
        if f.is_file() and (f.suffix == ".onnx" or ".onnx." in f.name or f.name.endswith(".extra_file")):
            f.unlink()


def _existing(version: Path) -> Path | None:
    files = sorted(version.glob("*.onnx"))
    return files[0] if files else None


def _install_real(folder: str, kind: str, version: Path, cache: Path, log: Callable[[str], None]) -> str:
    from gebackend.modelzoo.bench_models import models

    bench_name = _ENCODER_FOLDERS[folder][0] + ("_l4" if kind == "cnclip_l4" else "")
    source = models(cache)[bench_name].ensure(cache, log)
    _clear_onnx(version)
    link_or_copy(source, version / "model.onnx")
    if (source.parent / "model.onnx.data").is_file():
        link_or_copy(source.parent / "model.onnx.data", version / "model.onnx.data")
    return f"the real CN_CLIP encoder `{bench_name}` (cn_clip's model code, random weights) from {source}"


def _install_file(folder: str, source: Path, version: Path, log: Callable[[str], None]) -> str:
    """Copy a cn_clip export (and its external data) into the version folder, making a fixed batch 1 variable."""
    _, _, input_name, output_name, _ = _ENCODER_FOLDERS[folder]
    source = Path(source).resolve()
    model = onnx.load(str(source), load_external_data=False)
    inputs = {i.name: i for i in model.graph.input}
    outputs = {o.name: o for o in model.graph.output}
    if input_name not in inputs or output_name not in outputs:
        raise RuntimeError(f"{source}: expected input '{input_name}' and output '{output_name}' (the names cn_clip's "
                           f"pytorch_to_onnx.py writes), found inputs {sorted(inputs)} and outputs {sorted(outputs)}")
    data_files = sorted({e.value for t in _tensors(model) for e in t.external_data if e.key == "location"})
    _clear_onnx(version)
    for name in data_files:
        link_or_copy(source.parent / name, version / name)
    target = version / source.name
    dim0 = [t.type.tensor_type.shape.dim[0] for t in (inputs[input_name], outputs[output_name])]
    if all(d.HasField("dim_param") for d in dim0):
        link_or_copy(source, target)
        return f"{source} (variable batch dim)"
    for d in dim0:
        d.Clear()
        d.dim_param = "batch"
    onnx.save(model, str(target))
    problem = _batch_problem(target, input_name, output_name)
    if problem:
        target.unlink()
        raise RuntimeError(
            f"{source} has a fixed batch dim of 1 (cn_clip's pytorch_to_onnx.py exports without dynamic axes) and the "
            f"graph does not run at another batch size ({problem}). Re-export it with a dynamic batch axis: add "
            f"`dynamic_axes={{'{input_name}': {{0: 'batch'}}, '{output_name}': {{0: 'batch'}}}}` to that script's "
            f"torch.onnx.export call, or serve it with max_batch_size: 0 in every config of its ensemble")
    log(f"cnclip: {source.name}: fixed batch dim 1 made variable (batch 3 agrees with three batch-1 runs)")
    return f"{source} (batch dim made variable)"


def _tensors(model: onnx.ModelProto):
    yield from model.graph.initializer
    for node in model.graph.node:
        for attr in node.attribute:
            if attr.HasField("t"):
                yield attr.t


def _batch_problem(path: Path, input_name: str, output_name: str) -> str:
    """'' if the model at `path` gives at batch 3 what three batch-1 runs give, else what went wrong."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    meta = next(i for i in session.get_inputs() if i.name == input_name)
    shape = [3] + [int(d) for d in meta.shape[1:]]
    rng = np.random.default_rng(0)
    feed = (rng.integers(1, 5000, size=shape, dtype=np.int64) if "int64" in meta.type
            else rng.standard_normal(shape).astype(np.float32))
    try:
        batched = session.run([output_name], {input_name: feed})[0]
        rows = np.concatenate([session.run([output_name], {input_name: feed[i:i + 1]})[0] for i in range(3)])
    except Exception as exc:
        return f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
    if batched.shape != rows.shape or not np.allclose(batched, rows, rtol=1e-4, atol=1e-5):
        return "batch 3 differs from three batch-1 runs"
    return ""


def _remove_old_normalize(repo: Path, log: Callable[[str], None]) -> None:
    """The normalisation model an earlier `make cnclip` wrote, left behind without its config by a git update: a
    model folder Triton would try to load. Removed when it holds nothing else."""
    folder = repo / _OLD_NORMALIZE
    if not folder.is_dir() or (folder / "config.pbtxt").exists():
        return
    files = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
    if files in ([], ["1/model.onnx"]):
        shutil.rmtree(folder)
        log(f"cnclip: removed {folder} (left by an earlier build: the encoders now output the normalised features)")


def build_cnclip_repository(repo: Path, encoders: str = "auto", image_onnx: Path | None = None,
                            text_onnx: Path | None = None, cache: Path = DEFAULT_CACHE, force: bool = False,
                            log: Callable[[str], None] = print) -> dict[str, str]:
    """Write the repository's generated files; return what each encoder folder now holds (also logged)."""
    repo = Path(repo)
    folders = sorted(p for p in repo.iterdir() if (p / "config.pbtxt").is_file())
    if not folders:
        raise RuntimeError(f"{repo}: no model folders with a config.pbtxt")
    for folder in folders:
        (folder / "1").mkdir(exist_ok=True)
    kind = resolve_encoders(encoders)
    given = {"cnclip_image_encoder": image_onnx, "cnclip_text_encoder": text_onnx}
    built = {}
    for folder, (_, standin, _, output_name, normalized) in _ENCODER_FOLDERS.items():
        version = repo / folder / "1"
        if not version.parent.is_dir():
            continue
        if given[folder] is not None:
            built[folder] = "cn_clip export " + _install_file(folder, given[folder], version, log)
        else:
            existing = _existing(version)
            current = None if existing is None else ("standin" if is_standin(onnx.load(str(existing), load_external_data=False)) else "other")
            # auto keeps whatever is there (a stand-in, a real export, your own file); an explicit kind replaces another kind
            if existing is not None and not force and (encoders == "auto" or (current == "standin") == (kind == "standin")):
                built[folder] = (f"kept {existing} ({'a STAND-IN encoder' if current == 'standin' else 'not a stand-in'}; "
                                 f"--force / make cnclip FORCE=1 rebuilds)")
            elif kind == "standin":
                _clear_onnx(version)
                onnx.save(standin(), str(version / "model.onnx"))
                built[folder] = "a STAND-IN encoder (small, random weights: CN_CLIP's interface, not its model)"
            else:
                built[folder] = _install_real(folder, kind, version, cache, log)
        log(f"cnclip: {folder}: {built[folder]}")
        installed = _existing(version)
        if ensure_normalized_output(installed, output_name, normalized):
            log(f"cnclip: {folder}: added the output '{normalized}' ('{output_name}' L2-normalised) to {installed.name}")
    _remove_old_normalize(repo, log)
    if (repo / "cnclip_text_preprocess").is_dir():
        log(f"cnclip: cnclip_text_preprocess: vocabulary {copy_vocab(repo / 'cnclip_text_preprocess' / '1' / 'vocab.txt', cache)}")
    return built


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gebackend.modelzoo.cnclip_repository",
                                     description="Write the CN_CLIP repository's encoders (with their normalised outputs) and vocabulary.")
    parser.add_argument("repo", type=Path)
    parser.add_argument("--encoders", default="auto", choices=ENCODERS,
                        help="auto (default): the real CN_CLIP encoders when torch imports, else small stand-ins")
    parser.add_argument("--image-onnx", type=Path, help="an image encoder exported by cn_clip's pytorch_to_onnx.py (*.img.fp32.onnx)")
    parser.add_argument("--text-onnx", type=Path, help="a text encoder exported by cn_clip's pytorch_to_onnx.py (*.txt.fp32.onnx)")
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help="where the cn_clip wheel and real exports are cached")
    parser.add_argument("--force", action="store_true", help="rebuild encoders that are already there")
    args = parser.parse_args(argv)
    try:
        build_cnclip_repository(args.repo, args.encoders, args.image_onnx, args.text_onnx, args.cache, args.force)
    except (RuntimeError, ValueError, OSError) as exc:
        print(f"cnclip: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
