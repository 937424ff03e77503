"""The frontier with its peers at their best, like with like (Unsloth, Liger Kernel, NeMo AutoModel; the published peers),
and the front page's headline drawn from it."""
from __future__ import annotations

import polars as pl

from ftbench.harness.flops import peak_tflops
from ftbench.judge.compare.common import UNSTATED, _cv_text, _verdict, gemms_in, held_back, machine_key, peak_gib, peer_of, tokens_noise
from ftbench.judge.compare.ladder import ladder, quality_of, quality_text


def peer_run(runs: list[dict], own: dict) -> tuple[dict, list[str]]:
    """Of one peer's runs (a variant on one GPU kind, model and data; a later lease's and those it replaced), the
    one to read: the latest that names its settings, ran on a card not held back (`held_back`) and has a run of ours
    on its machine to be read against; else the latest. With why each later run was passed over."""
    runs = sorted(runs, key=lambda r: r.get("timestamp") or "", reverse=True)
    passed = []
    for r in runs:
        why = (None if r.get("peer.settings") else "its settings are not in its record") or held_back(r) or (
            None if ours_on(own, r) else "no rung of ours ran on its machine")
        if why is None:
            return r, passed
        passed.append(f"{run_label(r)}: {why}")
    r = runs[0]  # none to prefer: the latest, read all the same (a held-back card's lead said so)
    slowed = held_back(r)
    return r, [f"{run_label(r)}: {slowed} (no other run of it to read: read all the same)"] if slowed else []


def ours_on(own: dict, r: dict) -> list[dict]:
    """The project's own top runs (`own`: by machine key and GEMM precision) on run `r`'s machine."""
    return [x for (*m, _), x in own.items() if tuple(m) == machine_key(r)]


def run_label(r: dict) -> str:
    return f"{r['variant']} ({r['gpu']}, {r.get('machine')}, {str(r.get('timestamp') or '')[:10]})"


def peer_reads(table: pl.DataFrame, runs: pl.DataFrame, own: dict,
               replaced: pl.DataFrame | None = None) -> tuple[list, list, list]:
    """Each peer (Unsloth, Liger Kernel) beside the frontier, compared like with like: its runs whose records name the
    settings they ran with, against the project's fastest run standing on the frontier on the same machine in the
    same precision (bf16 against bf16, FP8 against FP8; a peer in NF4 against the bf16 rung: QLoRA's GEMMs are bf16)
    and against the fastest in any; a peer's run without its settings is refused, never divided.
    `table`: the frontier's rows; `runs`: the runs they came from; `own`: {(machine key, GEMM precision): the
    project's fastest run there standing on the frontier} (`ladder`'s `own_tops`: a rung or beside the ladder, the
    replaced runs of a machine included, never a peer; `replaced`: the runs a later lease's replaced, among which a
    peer's run is chosen too, `peer_run`). Returns (the peer table's rows, the refused and the passed over, and for
    each row (the peer's run, its same-precision top, its any-precision top))."""
    out, refused, read = [], [], []
    if table.is_empty() or "variant" not in table.columns or not runs.height:
        return out, refused, read

    def key(x, tokens):
        return x["variant"], x["gpu"], x["model"], x["dataset"], tokens

    rows_by = {key(r, r["throughput.tokens_per_s"] if r["status"] == "ok" else None): r
               for r in runs.iter_rows(named=True)}
    pool = runs if replaced is None or not replaced.height else pl.concat([runs, replaced], how="diagonal_relaxed")
    every = {}  # each peer's ok runs: the latest and the ones it replaced
    for r in pool.iter_rows(named=True):
        if r["status"] == "ok" and r["throughput.tokens_per_s"] and peer_of(r):
            every.setdefault(key(r, None), []).append(r)
    for t in table.iter_rows(named=True):
        r = rows_by.get(key(t, t["tokens/s (real)"]))
        system = peer_of(r) if r else None
        if not system or t["status"] != "ok" or not t["tokens/s (real)"]:
            continue
        r, passed = peer_run(every.get(key(t, None)) or [r], own)
        refused += passed
        if not r.get("peer.settings"):
            refused.append(f"{t['variant']} ({system}, {t['gpu']}): {UNSTATED.removeprefix('not compared: ')}")
            continue
        gemm = gemms_in(r)
        same = own.get((*machine_key(r), gemm))
        anyp = max(ours_on(own, r), key=lambda x: x["throughput.tokens_per_s"], default=None)
        read.append((r, same, anyp))
        out.append({"peer": system, "version": r.get("peer.version"), "variant": t["variant"], "gpu": t["gpu"],
                    "GEMMs in": gemm, "tokens/s (real)": r["throughput.tokens_per_s"],
                    "peak memory GiB": peak_gib(r),
                    "settings": r["peer.settings"],
                    "top rung's lead, same precision, same machine": lead_over(same, r),
                    "top rung's lead, any precision, same machine": lead_over(anyp, r)})
    return out, refused, read


def lead_over(top: dict | None, peer: dict, with_cv: bool = False) -> str | None:
    """Our run `top` over a peer's run, with the noise verdict of the two: "1.64x (variant, 20,392)", and with
    `with_cv` each run's CV across its windows beside it; None without a run of ours."""
    if top is None:
        return None
    tps = top["throughput.tokens_per_s"]
    cv = f", {_cv_text(top)}" if with_cv else ""
    return (f"{_verdict(tps / peer['throughput.tokens_per_s'], tokens_noise(top), tokens_noise(peer))} "
            f"({top['variant']}, {tps:,.0f}{cv})")


def peer_table(out: list, refused: list, read: list, quality: dict | None = None) -> list:
    """The report's "Peers at their best" from `peer_reads`, its note opening with the best peer and the lead over
    it (`best_peer_line`); without any peer's settings recorded it claims no lead."""
    note = ("Peers at their best, like with like: each peer's run whose record names the settings it ran with "
            "(the system's version, precision, checkpointing, the attention that ran, compilation, rows, the trainer's "
            "metrics, the optimizer), read against the fastest rung standing on the frontier measured on the same "
            "machine: in the same precision (bf16 GEMMs against bf16, FP8 against FP8; QLoRA's GEMMs are bf16) and "
            "in any. A lead is the rung's real tokens/s over the peer's, with its noise verdict. ")
    if not out and not refused:  # no peer beside the frontier
        return []
    if refused:
        note += "Refused a place, or passed over for the peer's earlier run: " + "; ".join(refused) + "."
    if not out:
        return [note + " No peer's run with its settings recorded: the report claims no lead over any peer.",
                ("Peers at their best", pl.DataFrame({"result": ["no peer run with its settings recorded"]}),
                 "frontier peers measured")]
    return [note.rstrip() + best_peer_line(read, quality),
            ("Peers at their best", pl.DataFrame(out, infer_schema_length=None), "frontier peers measured")]


def headline(df: pl.DataFrame, replaced: pl.DataFrame | None = None, rungs=(), beside=(), same_rows=None,
             quality: dict | None = None,
             **_) -> str | None:
    """For the report's front page, from the frontier's records (config compare.frontier) on the model and data of
    its rung 0 (`same_rows`): its fastest run at full scale on each GPU kind (standing on the frontier: its loss
    checked where it changes the arithmetic), and the best peer at its best with the lead over it, in any precision
    and like with like. None without a full-scale GPU run."""
    if df.is_empty() or "variant" not in df.columns:
        return None
    if same_rows:  # the frontier's own rows: the model and data its rung 0 ran on (not every run of a variant)
        df = df.join(df.filter(pl.col("variant") == same_rows).select("model", "dataset").unique(),
                     on=["model", "dataset"], how="semi")
    out, (_, _, read) = frontier_reads(df, {}, rungs, beside, same_rows, replaced, quality)
    if len(out) < 3 or "none ran" in out[0]:
        return None
    fastest = out[0].split(" <br>")[0].removeprefix(  # (the smaller scales and CPUs apart: not the published model)
        "Fastest configuration measured at full scale on a GPU: ")
    peers = best_peer_line(read, quality).strip() if read else (
        "No peer's run with its settings recorded: no lead over any peer is claimed.")
    return f"{fastest} {peers}"


def best_peer_line(read: list, quality: dict | None = None) -> str:
    """The sentence a reader of the frontier wants first: the fastest peer run at its best (with its settings), and
    the project's lead over it on the same machine, in any precision and in the peer's own, each with both runs'
    noise (their CV across windows) and its verdict, and with `quality` each rung's quality verdict beside it (a lead
    bought by a rung that costs quality says so). `read`: (peer run, same-precision top, any-precision top)."""
    r, same, anyp = max(read, key=lambda x: x[0]["throughput.tokens_per_s"])

    def lead(top):
        text = lead_over(top, r, with_cv=True) or "no rung of ours measured on its machine"
        return f"{text} [{quality_text(quality_of(quality, top))}]" if quality and top else text
    return (f" The best peer at its best: {r['variant']} ({peer_of(r)} {r.get('peer.version') or ''}, "
            f"{r['throughput.tokens_per_s']:,.0f} real tokens/s, {_cv_text(r)}, {r['gpu']}); the top rung's lead over "
            f"it on the same machine: {lead(anyp)} in any precision, {lead(same)} {gemms_in(r)} against {gemms_in(r)}.")


def frontier(df: pl.DataFrame, published: dict, rungs=(), beside=(), same_rows=None, replaced=None, quality=None,
             pool=None, **_) -> list:
    """The speed frontier past the ladder's top (one GPU, LoRA): each rung adds one technique (rows of a token
    budget, CUDA graphs, no per-step metric syncs, fused projections and optimizer, activation offloading, FP8),
    each at its own batch; loss on the evaluation set. Then the published figures of other systems on one GPU
    (`frontier_peers` in the study's published file), each beside the fastest rung measured here on its GPU."""
    out, reads = frontier_reads(df, published, rungs, beside, same_rows, replaced, quality, pool)
    table = out[-1][1]
    out += peer_table(*reads, quality=quality)
    peers = published.get("frontier_peers") or []
    if peers:
        out += peer_rows(table, peers)
    return out


def frontier_reads(df: pl.DataFrame, published: dict, rungs, beside, same_rows, replaced,
                   quality: dict | None = None, pool: dict | None = None) -> tuple[list, tuple]:
    """The frontier's ladder (each rung at its own batch, the evaluation loss) and its peers read like with like
    (`peer_reads`, against the project's own fastest runs of each machine that `ladder` collects): what `frontier`
    shows and `headline` sums up."""
    own = {}
    out = ladder(df, published, rungs, beside, by_batch=False, eval_loss=True, title="Frontier", same_rows=same_rows,
                 replaced=replaced, own_tops=own, quality=quality, pool=pool)
    table = out[-1][1]
    if not beside or "variant" not in table.columns:
        return out, ([], [], [])
    names = list(rungs) + list(beside)
    return out, peer_reads(table, df.filter(pl.col("variant").is_in(names)), own,
                           replaced.filter(pl.col("variant").is_in(names)) if replaced is not None and replaced.height
                           and "variant" in replaced.columns else None)


def peer_rows(table: pl.DataFrame, peers: list[dict]) -> list:
    """Published peers beside the frontier: each with its conditions and source, its MFU on its own count of model
    FLOPs, and the fastest full-scale rung measured here on the same GPU kind that may stand on the frontier (the
    ratio is context: other models and data)."""
    ours = {}
    if "tokens/s (real)" in table.columns:
        ok = table.filter(pl.col("tokens/s (real)").is_not_null() & (pl.col("scale") == "full"))
        if "on the frontier" in ok.columns:
            ok = ok.filter(pl.col("on the frontier").str.starts_with("yes"))
        for r in ok.sort("tokens/s (real)", descending=True).iter_rows(named=True):
            ours.setdefault(r["gpu"], r)
    rows = []
    for p in peers:
        peak, best = peak_tflops(p["gpu"], "bf16"), ours.get(p["gpu"])
        rows.append({"system": p["system"], "model": p["model"], "gpu": p["gpu"], "tokens/s": p["tokens_per_s"],
                     "MFU % (bf16 peak, its own FLOPs count)": 100 * p["model_tflops"] / peak if peak else None,
                     "conditions": " ".join(p["conditions"].split()), "source": p["source"],
                     "fastest here on this GPU": (f"{best['variant']} ({best['model']}, batch {best['batch']}): "
                                                  f"{best['tokens/s (real)']:,.0f} real tokens/s") if best else None,
                     "ours / theirs": best["tokens/s (real)"] / p["tokens_per_s"] if best else None})
    note = ("Published peers on one GPU, as their sources give them (other models and data than ours: context, not a "
            "verdict). 'Fastest here' is the fastest full-scale rung measured on the same GPU kind that stands on the "
            "frontier (its loss checked where it changes the arithmetic).")
    return [note, ("Published peers", pl.DataFrame(rows), "frontier peers")]

