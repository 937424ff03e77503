import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

LORA = {"r": 8, "alpha": 16, "dropout": 0.0,
        "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]}


def copy_tracked(dest: Path) -> Path:
    """The project's tracked files copied to `dest`, as a user's fresh clone would have them."""
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    for name in filter(None, files.split("\0")):
        src, dst = ROOT / name, dest / name
        if not src.exists() and not src.is_symlink():
            continue
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dst, follow_symlinks=False)
    return dest


def snakemake(*args, cwd=None, timeout=900):
    """Run snakemake from this environment; returns the CompletedProcess."""
    exe = Path(sys.executable).parent / "snakemake"
    return subprocess.run([str(exe), "-s", str(ROOT / "Snakefile"), *args], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture(scope="session")
def tiny_qwen(tmp_path_factory):
    from ftbench.config.architectures import load_architecture
    from ftbench.build.models import materialize_model

    out = tmp_path_factory.mktemp("qwen3-8b-tiny")
    return materialize_model(load_architecture(ROOT / "config/architectures/qwen3-8b.yaml", "tiny"), "random", out, 0)


@pytest.fixture(scope="session")
def instruction_data(tmp_path_factory):
    from ftbench.data.datasets import prepare_dataset

    out = tmp_path_factory.mktemp("alpaca")
    ddef = {"kind": "instruction", "source": "synthetic", "num_samples": 24, "eval_samples": 4}
    prepare_dataset(ddef, 42, out / "train.parquet", out / "eval.parquet")
    return ddef, out / "train.parquet", out / "eval.parquet"


def pytest_collection_modifyitems(config, items):
    """The end-to-end pipeline (minutes) first, so that under `pytest -n 2 --dist loadfile` (make test) one
    worker starts it at once while the other takes the rest of the suite."""
    items.sort(key=lambda item: item.get_closest_marker("e2e") is None)
