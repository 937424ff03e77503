"""Answers to fixed prompts before and after fine-tuning (the published qualitative check)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from ftbench.build.variants import load_pretrained


def _answers(model, tokenizer, prompts, gen: dict, seed: int, device) -> list[str]:
    out = []
    for i, prompt in enumerate(prompts):
        torch.manual_seed(seed + i)
        enc = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                            return_tensors="pt", return_dict=True).to(device)
        sampling = ({"do_sample": True, "temperature": gen["temperature"], "top_k": gen["top_k"], "top_p": gen["top_p"]}
                    if gen["temperature"] > 0 else {"do_sample": False})  # temperature 0: greedy, the same every run
        ids = model.generate(**enc, max_new_tokens=gen["max_new_tokens"], pad_token_id=tokenizer.pad_token_id,
                             **sampling)
        out.append(tokenizer.decode(ids[0, enc["input_ids"].shape[1]:], skip_special_tokens=True))
    return out


def before_after(manifest: dict, variant, adapter_dir, prompts: list[str], gen: dict, seed: int, device) -> dict:
    """Sample each prompt from the base model, then from the same model with the run's adapter."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    status = (Path(adapter_dir) / "status.txt").read_text().split()[0]
    tokenizer = AutoTokenizer.from_pretrained(manifest["path"])
    model = load_pretrained(AutoModelForCausalLM, manifest["path"], variant, device).eval()
    result = {"prompts": prompts, "generation": gen, "weights_source": manifest["weights_source"],
              "meaningful": manifest["weights_source"] != "random", "run_status": status,
              "before": _answers(model, tokenizer, prompts, gen, seed, device), "after": None}
    if status == "ok":
        model = PeftModel.from_pretrained(model, str(adapter_dir))
        result["after"] = _answers(model, tokenizer, prompts, gen, seed, device)
    return result


def to_html(result: dict, title: str) -> str:
    try:
        import polars as pl

        from ftbench.judge.analysis import html_page
    except ImportError:  # a training host without the report's packages (a lent GPU): the plain table
        return plain_html(result, title)
    after = result["after"] or [f"(no fine-tuned model: the run's status is {result['run_status']})"] * len(
        result["prompts"])
    columns = {"prompt": result["prompts"], "before fine-tuning": result["before"], "after fine-tuning": after}
    if result.get("references"):  # held-out prompts: what the held-out split itself answers
        columns["held-out answer"] = result["references"]
    df = pl.DataFrame(columns)
    note = ("Random weights: these answers are meaningless noise; they show the generation path works and what "
            "fine-tuning changes, nothing about quality." if not result["meaningful"] else
            f"Weights: {result['weights_source']}.")
    note += " " + sampling_text(result["generation"])
    return html_page(title, [note, ("Answers", df, "answers")])


def plain_html(result: dict, title: str) -> str:
    """The answers as a plain HTML table (no polars: a training host without the report's packages)."""
    from html import escape

    cols = ["prompts", "before", "after", "references"]
    rows = zip(*[result.get(c) or [""] * len(result["prompts"]) for c in cols])
    body = "".join("<tr>" + "".join(f"<td>{escape(str(v))}</td>" for v in row) + "</tr>" for row in rows)
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{escape(title)}</title></head><body>"
            f"<h3>{escape(title)}</h3><table><tr><th>prompt</th><th>before fine-tuning</th><th>after fine-tuning</th>"
            f"<th>held-out answer</th></tr>{body}</table></body></html>")


def sampling_text(g: dict) -> str:
    if g["temperature"] == 0:
        return f"Greedy decoding, max_new_tokens {g['max_new_tokens']}."
    return (f"Sampling: max_new_tokens {g['max_new_tokens']}, temperature {g['temperature']}, top_k {g['top_k']}, "
            f"top_p {g['top_p']}.")


def held_out_prompts(eval_path, kind: str, n: int) -> tuple[list[str], list[str]]:
    """The first `n` rows of the held-out split as (the user's prompt, the held-out answer)."""
    from ftbench.data.datasets import read_split, sft_messages

    rows = read_split(eval_path).select(range(n)).to_list()
    chats = [sft_messages(r, kind) for r in rows]
    return [c[0]["content"] for c in chats], [c[1]["content"] for c in chats]


def write(result: dict, json_path, html_path, title: str) -> None:
    Path(json_path).write_text(json.dumps(result, indent=2, ensure_ascii=False))
    Path(html_path).write_text(to_html(result, title))


def generate_job(params: dict, json_path, html_path) -> dict:
    """The generate job (run by its supervisor's child): answers before and after the run's adapter."""
    from ftbench.core.knobs import Variant
    from ftbench.harness.meter import pick_device

    manifest = json.loads(Path(params["manifest"]).read_text())
    gen = {k: v for k, v in params["generation"].items() if k not in ("prompts", "runs", "held_out_prompts")}
    prompts, references = params["generation"].get("prompts") or [], None
    if params["generation"].get("held_out_prompts"):  # prompts the fine-tune never saw, with their answers
        prompts, references = held_out_prompts(params["eval"], params["kind"], params["generation"]["held_out_prompts"])
    result = before_after(manifest, Variant.from_config(params["variant_name"], params["variant"]), params["adapter"],
                          prompts, gen, params["seed"], pick_device())
    result["references"] = references
    write(result, json_path, html_path, params["title"])
    return result


def write_failed(json_path, html_path, params: dict, status: str, reason: str, supervision: dict) -> dict:
    """What a generate job whose process died (or ran out of time) leaves: its status and why, no answers."""
    from ftbench.judge.analysis import html_page

    result = {"status": status, "reason": reason, "prompts": params["generation"].get("prompts"), "before": None,
              "after": None, "supervision": supervision}
    Path(json_path).write_text(json.dumps(result, indent=2, ensure_ascii=False))
    Path(html_path).write_text(html_page(params["title"], [f"No answers: the generation job {status}: {reason}."]))
    return result
