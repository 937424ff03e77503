"""Environments parse, agree with the pip pins, and every rule declares env, log and benchmark."""

import re
import tomllib
from pathlib import Path

import pytest
import yaml

from conftest import ROOT, snakemake

PINS = {}
for spec in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]:
    name, version = spec.split("==")
    PINS[name.lower()] = version
ENVS = sorted((ROOT / "envs").glob("*.yaml"))


@pytest.mark.parametrize("env", ENVS, ids=lambda p: p.name)
def test_env_parses_and_pins_agree_with_pyproject(env):
    spec = yaml.safe_load(env.read_text())
    pip = next(d["pip"] for d in spec["dependencies"] if isinstance(d, dict))
    assert "python=3.11" in spec["dependencies"]
    own = own_pins(env)  # a peer's environment keeps the pins the peer itself requires, each named with why
    for req in pip:
        name, _, version = req.partition("==")
        assert version, f"{env.name}: {req} is not pinned"
        name = re.sub(r"\[.*\]", "", name).lower()
        if name in PINS and name not in own:
            assert PINS[name] == version, f"{env.name}: {name}=={version}, pyproject pins {PINS[name]}"


def own_pins(env) -> set[str]:
    """The packages an env's header says it pins apart from pyproject ("own pins: NAME (why), ..."): a peer's
    environment at the versions the peer requires."""
    head = " ".join(line.lstrip("# ") for line in env.read_text().splitlines() if line.startswith("#"))
    found = re.search(r"own pins: (.*)", head)
    return {m.lower() for m in re.findall(r"([\w.-]+) \(", found.group(1))} if found else set()


def test_only_a_peer_env_departs_from_the_pins_and_says_why():
    departs = {env.name: own_pins(env) for env in ENVS if own_pins(env)}
    assert departs == {"nemo.yaml": {"transformers"}}
    pip = next(d["pip"] for d in yaml.safe_load((ROOT / "envs/nemo.yaml").read_text())["dependencies"]
               if isinstance(d, dict))
    assert "transformers==5.18.0" in pip and "nemo_automodel==0.7.0" in pip  # the version NeMo AutoModel requires


def test_gpu_extra_is_not_in_the_cpu_install():
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert not any(d.startswith(("unsloth", "transformer-engine")) for d in meta["dependencies"])
    assert any(d.startswith("unsloth") for d in meta["optional-dependencies"]["gpu"])


def test_every_rule_names_env_log_and_benchmark():
    text = "".join(p.read_text() for p in (ROOT / "rules").glob("*.smk"))
    for rule in re.split(r"\nrule ", "\n" + text)[1:]:
        name = rule.split(":")[0]
        for directive in ("conda:", "log:", "benchmark:"):
            assert directive in rule, f"rule {name} lacks {directive}"


def test_snakemake_lint_is_clean(tmp_path):
    proc = snakemake("--lint", "--configfile", str(ROOT / "config/config.yaml"), "-d", str(tmp_path), cwd=tmp_path)
    assert proc.returncode == 0 and "Lints for" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr


def test_snakemake_files_are_snakefmt_clean():
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    exe = Path(sys.executable).parent / "snakefmt"
    assert exe.exists() or shutil.which("snakefmt"), "snakefmt is a dev dependency (pip install -e '.[dev]')"
    proc = subprocess.run([str(exe) if exe.exists() else "snakefmt", "--check", "Snakefile", "rules"], cwd=ROOT,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


# import name of each package the project pins (the rest of an env's imports are the stdlib and ftbench)
MODULES = {"torch": "torch", "transformers": "transformers", "peft": "peft", "trl": "trl", "datasets": "datasets",
           "accelerate": "accelerate", "bitsandbytes": "bitsandbytes", "torchao": "torchao", "diffusers": "diffusers",
           "unsloth": "unsloth", "transformer-engine": "transformer_engine", "pillow": "PIL",
           "safetensors": "safetensors", "tokenizers": "tokenizers", "polars": "polars", "altair": "altair",
           "vl-convert-python": "vl_convert", "pandas": "pandas", "pyarrow": "pyarrow", "pyyaml": "yaml",
           "numpy": "numpy", "nvidia-ml-py": "pynvml", "gguf": "gguf"}
IMPLIED = {"pandas": ["numpy"], "pyarrow": ["numpy"], "torch": ["numpy"],  # what a package brings with it
           "datasets": ["pyarrow", "numpy", "pandas"]}

BLOCKER = '''
import builtins, sys
DENIED = set(sys.argv[1].split(","))
real_import = builtins.__import__
def deny(name, globals=None, locals=None, fromlist=(), level=0):
    # import statements only: libraries probing optional packages with importlib.util.find_spec are left alone
    if level == 0 and name.split(".")[0] in DENIED:
        raise ImportError(f"{name} is not in this rule's environment")
    return real_import(name, globals, locals, fromlist, level)
builtins.__import__ = deny
sys.path.insert(0, sys.argv[2])
for line in sys.argv[3].split(";"):
    exec(line)
'''


def rule_envs_and_scripts():
    """(rule, env file, script) for every rule; a rule whose env is chosen per variant is checked in its
    default env (train.yaml) and in the others that function can return by the same check below."""
    out = []
    for smk in sorted((ROOT / "rules").glob("*.smk")):
        for block in re.split(r"\nrule ", "\n" + smk.read_text())[1:]:
            name = block.split(":")[0]
            conda = re.search(r"conda:\s*\n\s*(\S+)", block).group(1).strip('"')
            script = re.search(r"script:\s*\n\s*\"([^\"]+)\"", block).group(1)
            envs = [conda] if conda.endswith(".yaml") else ["../envs/train.yaml"]
            for env in envs:
                out.append((name, (ROOT / "rules" / env).resolve(), (ROOT / "rules" / script).resolve()))
    return out


@pytest.mark.parametrize("rule, env, script", rule_envs_and_scripts(), ids=lambda v: getattr(v, "name", v))
def test_each_rule_imports_only_what_its_env_provides(rule, env, script):
    import subprocess
    import sys

    spec = yaml.safe_load(env.read_text())
    pip = next(d["pip"] for d in spec["dependencies"] if isinstance(d, dict))
    have = {re.sub(r"\[.*\]", "", r.partition("==")[0]).lower() for r in pip}
    have |= {m for p in list(have) for m in IMPLIED.get(p, [])}
    denied = sorted(mod for pkg, mod in MODULES.items() if pkg not in have)
    imports = [line.strip() for line in script.read_text().splitlines()
               if line.startswith(("from ftbench", "import ftbench"))]
    proc = subprocess.run([sys.executable, "-c", BLOCKER, ",".join(denied), str(ROOT / "src"), ";".join(imports)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, f"rule {rule} ({env.name}): {proc.stderr.strip().splitlines()[-1]}"


@pytest.mark.parametrize("env", sorted(p.stem for p in (ROOT / "envs").glob("*.yaml")))
def test_each_env_has_a_lock_file_that_agrees_with_its_pins(env):
    """envs/<env>.lock.txt (envs/lock.py) holds the env's whole pip closure at the env file's own pins; an env
    pip cannot resolve here says why in its lock file instead."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("lock", ROOT / "envs/lock.py")
    lock = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(lock)
    lock_file = ROOT / f"envs/{env}.lock.txt"
    assert lock_file.is_file(), f"run: python envs/lock.py {env}"
    pins = lock.read_lock(lock_file)
    if not pins:
        assert "not resolvable" in lock_file.read_text()
        return
    for req in lock.pip_requirements(ROOT / f"envs/{env}.yaml"):
        name, version = req.split("#")[0].strip().split("==")
        name = lock.canonical(name.split("[")[0])
        assert pins.get(name) == version, f"{env}: {name} is {version} in the env file, {pins.get(name)} in the lock"
    assert len(pins) > len(lock.pip_requirements(ROOT / f"envs/{env}.yaml"))  # the closure, not just the pins


# the modules ftbench.run.supervise._child imports for each kind of job it runs (test_the_child_map_is_supervises_own)
CHILD = {"materialize": ["ftbench.run.execute", "ftbench.build.models"], "generate": ["ftbench.run.execute", "ftbench.run.generate"],
         "train": ["ftbench.run.execute", "ftbench.harness.ranks", "ftbench.run.runners.causal_lm", "ftbench.run.runners.lmm",
                   "ftbench.run.runners.diffusion"],
         "profile": ["ftbench.run.execute", "ftbench.harness.ranks", "ftbench.run.profiling", "ftbench.run.runners.causal_lm",
                     "ftbench.run.runners.lmm", "ftbench.run.runners.diffusion"]}


def test_the_child_map_is_supervises_own():
    import ast

    child = next(n for n in ast.walk(ast.parse((ROOT / "src/ftbench/run/supervise.py").read_text()))
                 if isinstance(n, ast.FunctionDef) and n.name == "_child")
    imported = set()
    for n in ast.walk(child):  # `from ftbench.run.execute import x` and `from ftbench.harness import ranks`
        if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("ftbench."):
            for alias in n.names:
                module = f"{n.module}.{alias.name}"
                imported.add(module if (ROOT / "src" / (module.replace(".", "/") + ".py")).exists() else n.module)
    assert imported <= {m for mods in CHILD.values() for m in mods}, imported
    assert {"ftbench.build.models", "ftbench.run.generate", "ftbench.run.execute"} <= imported


def reached_modules(script: Path) -> list[Path]:
    """The library modules a rule's script reaches as it imports: its ftbench imports and, from each, the ftbench
    modules imported at module level (absolute or relative), as Python would load them."""
    import ast

    src = ROOT / "src"

    def module_file(name: str) -> Path | None:
        base = src.joinpath(*name.split("."))
        return next((p for p in (base.with_suffix(".py"), base / "__init__.py") if p.is_file()), None)

    def top_imports(path: Path, package: str) -> list[str]:
        out = []
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(parts + ([node.module] if node.module else []))
                else:
                    base = node.module or ""
                out += [base] + [f"{base}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                out += [a.name for a in node.names]
        return [n for n in out if n.split(".")[0] == "ftbench"]

    todo = top_imports(script, "")
    kind = re.search(r'supervise\(\s*"(\w+)"', script.read_text())
    if kind:  # the job runs in a child process (ftbench.run.supervise._child), which imports its job's modules
        todo += CHILD[kind.group(1)]
    seen: dict[str, Path] = {}
    while todo:
        name = todo.pop()
        path = module_file(name)
        if path is None or name in seen:
            continue
        seen[name] = path
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        todo += top_imports(path, package)
    return sorted(set(seen.values()))


# function-level imports of a reached module that serve other rules' jobs, never this env's (each with why): the
# report's pages read profiles and token counts that the profile and token_stats jobs wrote in the train env
ELSEWHERE = {("report.yaml", "src/ftbench/run/profiling.py"): {"torch"},  # the profiler itself: the profile job's
             ("report.yaml", "src/ftbench/data/datasets.py"): {"datasets", "pillow"},  # preparing data: prepare_dataset's
             ("report.yaml", "src/ftbench/data/tokens.py"): {"transformers"}}  # tokenizing: the token_stats job's


# packages a variant needs only on a GPU host, in their own envs (envs/unsloth.yaml, envs/te.yaml); a run without
# them records `unsupported` (ftbench.build.variants.check_supported)
OWN_ENVS = {"unsloth", "transformer-engine"}


@pytest.mark.parametrize("rule, env, script", rule_envs_and_scripts(), ids=lambda v: getattr(v, "name", v))
def test_each_rules_env_holds_every_pinned_package_its_library_code_imports_anywhere(rule, env, script):
    """Issue 79: not only what imports at load time; every import statement (function-level too) of the library
    modules the script reaches names a pinned package its env holds (gguf for a GGUF model's materialize job)."""
    import ast

    spec = yaml.safe_load(env.read_text())
    pip = next(d["pip"] for d in spec["dependencies"] if isinstance(d, dict))
    have = {re.sub(r"\[.*\]", "", r.partition("==")[0]).lower() for r in pip}
    have |= {m for p in list(have) for m in IMPLIED.get(p, [])}
    by_module = {mod: pkg for pkg, mod in MODULES.items() if pkg not in OWN_ENVS}
    missing = set()
    for path in reached_modules(script):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module] if isinstance(node, ast.ImportFrom) and not node.level and node.module else [])
            for n in names:
                pkg = by_module.get(n.split(".")[0])
                if pkg and pkg not in have and pkg not in ELSEWHERE.get((env.name, str(path.relative_to(ROOT))), ()):
                    missing.add(f"{pkg} ({path.relative_to(ROOT)})")
    assert not missing, f"rule {rule} ({env.name}) lacks {sorted(missing)}"


def test_the_materialize_env_holds_every_gguf_model_package_a_shipped_config_names():
    """Issue 79: a GGUF model source that names a package (its file shipped in it) is read by materialize_model in
    envs/train.yaml, which must hold that package."""
    spec = yaml.safe_load((ROOT / "envs/train.yaml").read_text())
    pip = next(d["pip"] for d in spec["dependencies"] if isinstance(d, dict))
    have = {r.partition("==")[0].lower() for r in pip}
    named = set()
    for f in (ROOT / "config").glob("*.yaml"):
        for mdef in (yaml.safe_load(f.read_text()) or {}).get("models", {}).values():
            if isinstance(mdef, dict) and (mdef.get("gguf") or {}).get("package"):
                named.add(mdef["gguf"]["package"].lower())
    assert named and named <= have, named - have
