"""Datasets: synthesized offline with the statistics that matter for speed, or loaded from a hub."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np

from ftbench.core.stdlib_text import HELD_OUT_MODULES, PYTHON_DOCS_LICENSE, held_out_module, python_docs  # noqa: F401

BEAN_LABELS = ["angular_leaf_spot", "bean_rust", "healthy"]
_SYLLABLES = [c + v for c in ["", "k", "s", "t", "n", "h", "m", "y", "r", "w", "g", "z", "d", "b", "p", "sh", "ch", "ts"]
              for v in "aiueo"]


def lexicon(size: int = 1500) -> list[str]:
    """Pseudo-words of 2-4 syllables, the same for every dataset, so a BPE trained on them
    (the offline tokenizer) makes about one token of each."""
    rng = np.random.default_rng(20240601)
    words = set()
    while len(words) < size:
        words.add("".join(rng.choice(_SYLLABLES, size=rng.integers(2, 5))))
    return sorted(words)


def _lognormal_lengths(rng, n, mean, sigma, low=1):
    mu = np.log(mean) - sigma**2 / 2  # so the distribution's mean is `mean`
    return np.maximum(low, rng.lognormal(mu, sigma, size=n).round().astype(int))


def _sentence(rng, words, n):
    return " ".join(rng.choice(words, size=max(1, n))).capitalize() + "."


def _paragraph(rng, words, n_words):
    out, left = [], n_words
    while left > 0:
        k = min(left, int(rng.integers(8, 25)))
        out.append(_sentence(rng, words, k))
        left -= k
    return " ".join(out)


def synth_instruction(n: int, seed: int, p: dict) -> dict:
    """japanese_alpaca-like instruction / input / output triples (about 117 tokens after the template)."""
    rng = np.random.default_rng(seed)
    words = lexicon()
    ins = _lognormal_lengths(rng, n, p.get("instruction_words", 10), 0.5)
    inp = _lognormal_lengths(rng, n, p.get("input_words", 19), 0.8)
    has_input = rng.random(n) < p.get("share_with_input", 0.4)
    out = _lognormal_lengths(rng, n, p.get("output_words", 46), 0.9)
    return {
        "instruction": [_paragraph(rng, words, k) for k in ins],
        "input": [_paragraph(rng, words, k) if h else "" for k, h in zip(inp, has_input)],
        "output": [_paragraph(rng, words, k) for k in out],
    }


def synth_wikipedia(n: int, seed: int, p: dict) -> dict:
    """wikipedia_ja-like articles: a title and a long body (about 861 tokens after truncation at 2048)."""
    rng = np.random.default_rng(seed)
    words = lexicon()
    lengths = _lognormal_lengths(rng, n, p.get("body_words", 670), p.get("body_sigma", 0.8), low=20)
    return {
        "title": [" ".join(rng.choice(words, size=rng.integers(1, 4))).title() for _ in range(n)],
        "text": [_paragraph(rng, words, k) for k in lengths],
    }


def _leaf_image(rng, width, height, label_idx):
    """A green leaf on a soil background, with spots whose look depends on the label."""
    from PIL import Image, ImageDraw, ImageFilter  # here: the report's environment reads token stats without PIL

    bg = rng.integers(60, 120, size=3)
    img = Image.new("RGB", (width, height), tuple(int(c) for c in bg))
    draw = ImageDraw.Draw(img)
    cx, cy = width * rng.uniform(0.4, 0.6), height * rng.uniform(0.4, 0.6)
    rx, ry = width * rng.uniform(0.25, 0.4), height * rng.uniform(0.3, 0.45)
    green = (int(rng.integers(30, 80)), int(rng.integers(110, 180)), int(rng.integers(30, 70)))
    draw.ellipse([cx - rx, cy - ry, cx + rx, cy + ry], fill=green)
    spot = [(120, 90, 40), (150, 60, 20), None][label_idx]
    if spot is not None:
        for _ in range(int(rng.integers(10, 40))):
            x, y = cx + rng.uniform(-rx, rx) * 0.8, cy + rng.uniform(-ry, ry) * 0.8
            r = rng.uniform(2, 8) * width / 500
            draw.ellipse([x - r, y - r, x + r, y + r], fill=spot)
    noise = rng.integers(-12, 12, size=(height, width, 3))
    arr = np.clip(np.asarray(img, dtype=np.int16) + noise, 0, 255).astype(np.uint8)
    return Image.fromarray(arr).filter(ImageFilter.GaussianBlur(0.6))


def _jpeg(img) -> dict:
    buf = io.BytesIO()
    img.save(buf, format="JPEG", quality=90)
    return {"bytes": buf.getvalue(), "path": None}


def synth_images(n: int, seed: int, p: dict) -> dict:
    """beans-like leaf photos with 3 labels; `sizes` lists (width, height) to mix aspect ratios."""
    rng = np.random.default_rng(seed)
    sizes = [tuple(s) for s in p.get("sizes", [[500, 500]])]
    labels = rng.integers(0, len(BEAN_LABELS), size=n)
    pick = rng.integers(0, len(sizes), size=n)
    return {
        "image": [_jpeg(_leaf_image(rng, *sizes[i], int(lab))) for i, lab in zip(pick, labels)],
        "labels": [int(x) for x in labels],
    }


def synth_captions(n: int, seed: int, p: dict) -> dict:
    """naruto-like 512x512 images with a caption each."""
    rng = np.random.default_rng(seed)
    words = lexicon()[:400]
    size = p.get("size", 512)
    images, captions = [], []
    for _ in range(n):
        img = _leaf_image(rng, size, size, int(rng.integers(0, 3)))
        images.append(_jpeg(img))
        captions.append("a drawing of " + " ".join(rng.choice(words, size=rng.integers(4, 12))))
    return {"image": images, "text": captions}


SYNTHESIZERS = {
    "instruction": synth_instruction,
    "wikipedia": synth_wikipedia,
    "image_classification": synth_images,
    "image_caption": synth_captions,
}


def python_docs_split(ddef: dict, seed: int):
    """`num_samples` rows of the modules trained on, then `eval_samples` of the held-out modules (the held-out
    split: prepare_dataset takes the last rows), each part in an order drawn from the seed."""
    import datasets

    rows = python_docs(ddef["kind"])
    rng = np.random.default_rng(seed)
    parts = []
    for held, n in ((False, ddef["num_samples"]), (True, ddef.get("eval_samples", 0))):
        pool = [r for r in rows if held_out_module(r["module"]) == held]
        if len(pool) < n:
            raise ValueError(f"python_docs ({ddef['kind']}): {len(pool)} {'held-out' if held else 'training'} rows "
                             f"in this Python's standard library, config asks for {n}")
        parts += [pool[i] for i in rng.permutation(len(pool))[:n]]
    return datasets.Dataset.from_list(parts)


def _features(kind):
    import datasets

    if kind == "image_classification":
        return datasets.Features({"image": datasets.Image(), "labels": datasets.ClassLabel(names=BEAN_LABELS)})
    if kind == "image_caption":
        return datasets.Features({"image": datasets.Image(), "text": datasets.Value("string")})
    return None


def load_dataset_split(ddef: dict, seed: int):
    """The dataset a config entry names: synthesized, or loaded from a hub id / local path."""
    import datasets

    n_total = ddef["num_samples"] + ddef.get("eval_samples", 0)
    if ddef["source"] == "python_docs":
        return python_docs_split(ddef, seed)
    if ddef["source"] == "synthetic":
        columns = SYNTHESIZERS[ddef["kind"]](n_total, seed, ddef.get("synthetic", {}))
        ds = datasets.Dataset.from_dict(columns, features=_features(ddef["kind"]))
    else:
        from ftbench.config.settings import DATA_SUFFIXES, check_columns

        path = Path(ddef["source"]).expanduser()
        if path.is_file():  # a local file: its format by suffix
            ds = datasets.load_dataset(DATA_SUFFIXES[path.suffix], data_files=str(path), split="train")
        else:  # a local directory or a hub id
            ds = datasets.load_dataset(ddef["source"], ddef.get("subset"), split=ddef.get("split", "train"))
        check_columns(ddef.get("name", ddef["source"]), ddef, ds.column_names)
        renames = {src: dst for dst, src in ddef.get("columns", {}).items() if src != dst}
        if renames:
            ds = ds.rename_columns(renames)
        ds = ds.shuffle(seed=seed)
        if len(ds) < n_total:
            raise ValueError(f"{ddef['source']}: {len(ds)} samples, config asks for {n_total}")
        ds = ds.select(range(n_total))
    return ds


def verify_images(ds, ddef: dict):
    """Decode every image of a local or hub dataset once, here, rather than mid-training: each is embedded
    as bytes (a local image folder stores only paths, which the runners cannot read), and one that does not
    decode stops preparation naming its file and row (`on_bad_image: error`, the default) or is dropped and
    listed (`skip`). Returns the dataset and the bad images."""
    import datasets
    from PIL import Image

    raw = ds.cast_column("image", datasets.Image(decode=False))
    policy, images, keep, bad = ddef.get("on_bad_image", "error"), [], [], []
    for i, item in enumerate(raw["image"]):
        where = item.get("path") or f"row {i}"
        try:
            data = item.get("bytes") or Path(item["path"]).read_bytes()
            with Image.open(io.BytesIO(data)) as im:
                im.load()  # decodes the whole file: a truncated JPEG fails here, not in the 500th step
            images.append({"bytes": data, "path": None})
            keep.append(i)
        except Exception as e:  # noqa: BLE001 — any image that does not decode is named
            if policy != "skip":
                raise ValueError(f"dataset {ddef.get('name', ddef['source'])}: row {i} ({where}): image does not "
                                 f"decode: {e} (set on_bad_image: skip to drop such images)") from e
            bad.append({"row": i, "file": item.get("path"), "error": str(e)[:200]})
    rest = ds.select(keep).remove_columns("image")
    out = rest.add_column("image", images).cast_column("image", datasets.Image())
    return out, bad


def prepare_dataset(ddef: dict, seed: int, train_path, eval_path) -> dict:
    """Write the train and held-out splits as parquet (datasets' own format); return a summary."""
    ds = load_dataset_split(ddef, seed)
    bad = []
    if ddef["source"] != "synthetic" and "image" in ds.column_names:
        ds, bad = verify_images(ds, ddef)
    origin = {}
    if ddef["source"] == "python_docs":  # what the text is and under which license; the Python it came from
        import hashlib
        import platform

        origin = {"license": PYTHON_DOCS_LICENSE, "python": platform.python_version(),
                  "held_out": f"whole modules, one in {HELD_OUT_MODULES} by a digest of the name",
                  "text_sha256": hashlib.sha256("\x00".join(map(str, ds.to_list())).encode()).hexdigest()[:16]}
    n_eval = ddef.get("eval_samples", 0)
    train, held_out = ds.select(range(len(ds) - n_eval)), ds.select(range(len(ds) - n_eval, len(ds)))
    for split, path in ((train, train_path), (held_out, eval_path)):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        split.to_parquet(str(path))
    return {"source": ddef["source"], "kind": ddef["kind"], "train": len(train), "eval": len(held_out),
            "columns": list(ds.column_names), "on_bad_image": ddef.get("on_bad_image", "error"),
            "bad_images": bad, **origin}


def read_split(path):
    import datasets

    return datasets.Dataset.from_parquet(str(path))


def text_corpus(n: int = 400, seed: int = 0):
    """Text for training the offline tokenizer: the same lexicon the text datasets draw from."""
    ins = synth_instruction(n, seed, {})
    wiki = synth_wikipedia(n // 4, seed, {"body_words": 200})
    yield from ins["instruction"]
    yield from ins["output"]
    yield from wiki["text"]
    yield from wiki["title"]
    yield "a drawing of Describe " + " ".join(BEAN_LABELS)


def sft_messages(example: dict, kind: str) -> list[dict]:
    """The chat a text sample becomes: instruction (+ input) -> output, or body minus first sentence -> title."""
    if kind == "instruction":
        user = example["instruction"] + (("\n\n" + example["input"]) if example.get("input") else "")
        answer = example["output"]
    elif kind == "wikipedia":
        body = example["text"]
        cut = body.find(". ")
        user, answer = (body[cut + 2:] if cut >= 0 else body), example["title"]
    else:
        raise ValueError(f"dataset kind {kind!r} has no chat form")
    return [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]
