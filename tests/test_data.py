"""Synthesized datasets: deterministic, with the statistics that matter; hub loading on local files."""

import numpy as np
import pytest

from ftbench.data.datasets import (BEAN_LABELS, load_dataset_split, prepare_dataset, read_split, sft_messages,
                          synth_instruction, synth_wikipedia)
from ftbench.data.tokens import length_stats, text_token_lengths


def test_synthesis_is_deterministic_given_a_seed():
    assert synth_instruction(20, 7, {}) == synth_instruction(20, 7, {})
    assert synth_instruction(20, 7, {}) != synth_instruction(20, 8, {})


@pytest.mark.parametrize("kind, n, published_mean", [("instruction", 400, 117), ("wikipedia", 300, 861)])
def test_token_lengths_match_the_published_means(tiny_qwen, kind, n, published_mean):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_qwen["path"])
    cols = (synth_instruction if kind == "instruction" else synth_wikipedia)(n, 42, {})
    rows = [dict(zip(cols, vals)) for vals in zip(*cols.values())]
    stats = length_stats(text_token_lengths(tok, rows, kind), 2048)
    assert stats["mean_truncated"] == pytest.approx(published_mean, rel=0.1)
    if kind == "wikipedia":
        assert 0.02 < stats["share_truncated"] < 0.3  # a long tail is cut at 2048


def test_wikipedia_chat_drops_the_first_sentence_and_answers_the_title():
    msgs = sft_messages({"title": "Tokyo", "text": "First one. Second one. Third."}, "wikipedia")
    assert msgs[0]["content"] == "Second one. Third." and msgs[1]["content"] == "Tokyo"


def test_images_have_the_configured_sizes_and_labels(tmp_path):
    ddef = {"kind": "image_classification", "source": "synthetic", "num_samples": 6, "eval_samples": 2,
            "synthetic": {"sizes": [[500, 500], [1024, 256]]}}
    summary = prepare_dataset(ddef, 1, tmp_path / "t.parquet", tmp_path / "e.parquet")
    assert (summary["train"], summary["eval"]) == (6, 2)
    ds = read_split(tmp_path / "t.parquet")
    assert {(ex["image"].width, ex["image"].height) for ex in ds} <= {(500, 500), (1024, 256)}
    assert ds.features["labels"].names == BEAN_LABELS


def test_hub_path_loads_a_local_dataset_in_the_hubs_format(tmp_path):
    """datasets.load_dataset on a folder laid out like a hub repo (data/train-*.parquet), columns renamed."""
    import datasets

    repo = tmp_path / "fujiki_japanese_alpaca_data"
    (repo / "data").mkdir(parents=True)
    n = 30
    datasets.Dataset.from_dict({
        "instruction": [f"q{i}" for i in range(n)], "input": [""] * n, "response": [f"a{i}" for i in range(n)],
    }).to_parquet(str(repo / "data" / "train-00000-of-00001.parquet"))
    ddef = {"kind": "instruction", "source": str(repo), "split": "train", "num_samples": 10, "eval_samples": 2,
            "columns": {"output": "response"}}
    ds = load_dataset_split(ddef, seed=42)
    assert len(ds) == 12 and "output" in ds.column_names
    assert ds["instruction"] != [f"q{i}" for i in range(12)]  # shuffled with the seed
    assert ds["instruction"] == load_dataset_split(ddef, seed=42)["instruction"]
    with pytest.raises(ValueError, match="asks for"):
        load_dataset_split(dict(ddef, num_samples=100), seed=42)


def test_length_stats():
    s = length_stats([10, 20, 30, 4000], 2048)
    assert s["mean"] == 1015 and s["mean_truncated"] == pytest.approx((60 + 2048) / 4)
    assert s["share_truncated"] == 0.25 and s["max"] == 4000
    assert np.isclose(s["median"], 25)


def test_a_local_image_folder_is_verified_and_embedded_and_a_corrupt_image_is_named(tmp_path):
    """Every image decodes at preparation or is named (file and row); images are stored as bytes, which
    the runners read (an image folder alone gives paths)."""
    import io

    import pyarrow.parquet as pq
    import pytest
    from PIL import Image

    from ftbench.data.datasets import prepare_dataset

    folder = tmp_path / "pics"
    folder.mkdir()
    lines = ["file_name,text"]
    for i in range(8):
        buf = io.BytesIO()
        Image.new("RGB", (64, 48), (10 * i, 80, 40)).save(buf, format="JPEG")
        data = buf.getvalue()
        (folder / f"{i}.jpg").write_bytes(data[: len(data) // 2] if i == 5 else data)  # 5.jpg is truncated
        lines.append(f"{i}.jpg,a drawing number {i}")
    (folder / "metadata.csv").write_text("\n".join(lines) + "\n")
    ddef = {"name": "pics", "kind": "image_caption", "source": str(folder), "num_samples": 6, "eval_samples": 2}
    with pytest.raises(ValueError, match=r"dataset pics: row \d+ \(.*5\.jpg\): image does not decode"):
        prepare_dataset(ddef, 0, tmp_path / "t.parquet", tmp_path / "e.parquet")
    summary = prepare_dataset(dict(ddef, on_bad_image="skip"), 0, tmp_path / "t.parquet", tmp_path / "e.parquet")
    assert summary["on_bad_image"] == "skip" and [b["file"].endswith("5.jpg") for b in summary["bad_images"]] == [True]
    assert summary["train"] + summary["eval"] == 7
    images = pq.read_table(tmp_path / "t.parquet").column("image").to_pylist()
    assert all(im["bytes"] for im in images)  # embedded: the diffusion runner reads bytes
