"""A study's variants: as config writes them (each a base and what it adds: ftbench.config.techniques), as a runner reads
them (flat knobs), and `pick`, a name for the fastest of a list that this install can run."""

from __future__ import annotations

import importlib.util

from ftbench.core.knobs import ConfigError, Variant, required_packages, same_numbers
from ftbench.config.techniques import TechniqueError, lineage, resolve, resolve_all


def variant_pool(config: dict, study: str) -> dict:
    """The variants a study can name as config writes them (each a base and what it adds, or knobs): the global
    ones, overridden and extended by the study's own (studies may reuse a name, e.g. `compile`, for different knob
    sets)."""
    return {**config.get("variants", {}), **(config["studies"][study].get("variants") or {})}


def all_variants(config: dict) -> dict:
    """Every study's variants as config writes them, the global ones then each study's own (a page across studies
    reads a name two studies share from its records first: ftbench.config.techniques.legend)."""
    out = dict(config.get("variants", {}))
    for sdef in config["studies"].values():
        out.update(sdef.get("variants") or {})
    return out


def study_variants(config: dict, study: str) -> dict:
    """The variants a study can name, each as the flat knobs it runs with (its base's, then what it adds:
    ftbench.config.techniques.resolve)."""
    try:
        return resolve_all(variant_pool(config, study))
    except TechniqueError as e:
        raise ConfigError(str(e)) from None


def study_lineage(config: dict, study: str) -> dict[str, list[str]]:
    """Each variant a study can name, with its bases nearest first (ftbench.config.techniques.lineage)."""
    pool = variant_pool(config, study)
    return {name: lineage(name, pool) for name in pool}


def variant_knobs(config: dict, study: str, name: str) -> dict:
    """One variant's flat knobs: its own chain of bases resolved, not the whole pool."""
    try:
        return resolve(name, variant_pool(config, study))
    except TechniqueError as e:
        raise ConfigError(str(e)) from None


def all_variant_names(config: dict) -> list[str]:
    return list(all_variants(config))


def pick_variants(config: dict, installed=None) -> list[str]:
    """Config `pick: {NAME: [variant, ...]}` (fastest first): each NAME in a study's matrix, generate runs and
    profile becomes the first variant of its list whose packages this install has (`knobs.required_packages`;
    `installed`: a package name -> bool, by default importlib's find_spec), so the records and folders name the
    variant that ran. Returns one line per pick saying which it took and what it passed over, and why."""
    installed = installed or (lambda name: importlib.util.find_spec(name) is not None)
    said, chosen = [], {}
    for name, order in (config.get("pick") or {}).items():
        passed = []
        for candidate in order:
            study = next((s for s in config["studies"] if candidate in variant_pool(config, s)), None)
            if study is None:
                raise ConfigError(f"pick.{name}: {candidate!r} is not a variant")
            missing = [p for p in required_packages(Variant.from_config(candidate, variant_knobs(config, study,
                                                                                               candidate)))
                       if not installed(p)]
            if not missing:
                chosen[name] = candidate
                break
            passed.append(f"{candidate} (needs {', '.join(missing)}, not installed)")
        if name not in chosen:
            raise ConfigError(f"pick.{name}: none of its variants can run with this install: {'; '.join(passed)}")
        said.append(f"pick.{name}: {chosen[name]}, the first of its list (fastest first) whose packages are installed"
                    + (f"; passed over: {'; '.join(passed)}" if passed else ""))
    if not chosen:
        return said
    for sdef in config["studies"].values():
        for block in sdef.get("matrix") or []:
            block["variants"] = [chosen.get(v, v) for v in block["variants"]]
        for run in (sdef.get("generate") or {}).get("runs") or []:
            run["variant"] = chosen.get(run["variant"], run["variant"])
    for run in config.get("profile") or []:
        if "variant" in run:
            run["variant"] = chosen.get(run["variant"], run["variant"])
    return said



def changes_numbers(name: str, pool: dict) -> bool:
    """Whether a variant's knobs differ from those of the variant it stands on by more than NUMERICS_FREE knobs
    (a variant on no base changes them)."""
    chain = lineage(name, pool)
    if len(chain) < 2:
        return True
    return not same_numbers(resolve(name, pool), resolve(chain[1], pool))


def expand_seeds(config: dict) -> list[str]:
    """The quality study's seeds as runs: where a study's `quality.seeds` are integers, each variant of its matrix
    that changes the numbers (`changes_numbers`) runs under each of them too, as `NAME-sSEED` (its base NAME, knob
    seed), beside NAME under config's seed; a variant that changes none runs once (ftbench.judge.quality judges it by its
    bit-identity with the rung it stands on). Returns the variant names added."""
    added = []
    for study, sdef in config["studies"].items():
        seeds = (sdef.get("quality") or {}).get("seeds") or []
        if not seeds or not all(isinstance(s, int) and not isinstance(s, bool) for s in seeds):
            continue
        pool = variant_pool(config, study)
        own = sdef.setdefault("variants", {})
        for block in sdef.get("matrix") or []:
            names = []
            for v in block["variants"]:
                names.append(v)
                if v not in pool:
                    continue  # (check_config names it)
                chain = lineage(v, pool)
                if not changes_numbers(v, pool) and len(chain) > 1 and chain[1] in block["variants"]:
                    continue  # judged by its bit-identity with the rung it stands on, run beside it
                for seed in seeds:
                    if seed == config.get("seed"):
                        continue
                    extra = f"{v}-s{seed}"
                    if extra not in pool:
                        own[extra] = {"base": v, "seed": seed}
                        added.append(extra)
                    if extra not in block["variants"] and extra not in names:
                        names.append(extra)
            block["variants"] = names
    return added
