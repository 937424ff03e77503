"""A warm start for the supervised child processes: a server that has imported torch, transformers, peft, TRL,
datasets and diffusers once forks each job's child from itself, so a job pays ~0.1 s instead of the 7-14 s
those imports take (most of a tiny job's time; `fork_server` in config, on by default).

The child is what a fresh `python -m ftbench.run.supervise JOB` would be: its own session (the supervisor's time
and memory limits and kill-by-session work as before), the job's environment, working directory, log and
arguments. A hard fault still kills only the child. The server imports nothing that initializes CUDA (a forked
CUDA context is unusable): it checks this before it serves, and the child initializes CUDA itself, under the
job's CUDA_VISIBLE_DEVICES.

One server per interpreter, working directory, ftbench source state and import-relevant environment (the key
names them); a job whose key matches no running server starts one (under a lock) and waits for it. The server
leaves once it has been idle FTBENCH_FORKSERVER_IDLE_S seconds (60) with no child left. Where anything fails,
the supervisor starts its child the plain way (`unavailable`), and the record says which way it started
(`extra.supervision.launcher`). Not used for Unsloth (it must be imported before transformers) nor for jobs
that start several ranks (torchrun).

    python -m ftbench.run.forkserver SOCKET     # the server (started by `spawn`)
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

SRC = Path(__file__).resolve().parents[1]  # the library (src/ftbench): its files' digest
# what a job's child imports that takes seconds; each is tried, and one that fails only loses its warm start
PRELOAD = ("torch", "transformers", "peft", "datasets", "trl", "diffusers", "ftbench.run.execute", "ftbench.run.supervise",
           "ftbench.run.runners.causal_lm", "ftbench.run.runners.lmm", "ftbench.run.runners.diffusion", "ftbench.build.models",
           "ftbench.run.generate", "ftbench.run.profiling")
# names under transformers / trl / diffusers that load their submodules lazily, on first access
PRELOAD_ATTRS = {"transformers": ("Trainer", "TrainerCallback", "AutoModelForCausalLM", "AutoTokenizer",
                                  "AutoProcessor", "LlavaNextForConditionalGeneration", "CLIPTextModel"),
                 "trl": ("SFTConfig", "SFTTrainer"),
                 "diffusers": ("UNet2DConditionModel", "AutoencoderKL", "DDPMScheduler", "StableDiffusionPipeline")}
# environment read while importing (library paths, thread pools, hub and cache settings): part of the key
KEY_ENV_PREFIXES = ("PATH", "LD_", "PYTHON", "HOME", "XDG_", "TMPDIR", "HF_", "TRANSFORMERS_", "DIFFUSERS_",
                    "DATASETS_", "TOKENIZERS_", "TORCH", "PYTORCH_", "TRITON_", "CUDA_HOME", "NVIDIA_", "OMP_",
                    "MKL_", "OPENBLAS_", "BNB_", "ACCELERATE_", "FTBENCH_CPU_THREADS", "FTBENCH_FORKSERVER_")


class Unavailable(RuntimeError):
    """No fork server could take the job; the caller starts its child the plain way."""


def enabled() -> bool:
    return os.environ.get("FTBENCH_FORK_SERVER") == "1"


def _source_state() -> str:
    h = hashlib.sha256()
    for path in sorted(SRC.rglob("*.py")):
        st = path.stat()
        h.update(f"{path}:{st.st_mtime_ns}:{st.st_size}\n".encode())
    return h.hexdigest()


def key(env: dict, cwd: str) -> str:
    """What a server must share with a job to fork its child: interpreter, working directory, the ftbench code
    (an edited file starts a new server) and the environment read at import time."""
    picked = sorted((k, v) for k, v in env.items() if k.startswith(KEY_ENV_PREFIXES))
    blob = json.dumps([sys.executable, cwd, _source_state(), picked])
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


def _socket_dir() -> Path:
    """FTBENCH_FORKSERVER_DIR, else a folder in the temporary directory (in /tmp where that path would make a
    socket name longer than the 107 bytes AF_UNIX takes)."""
    path = Path(os.environ.get("FTBENCH_FORKSERVER_DIR") or tempfile.gettempdir()) / f"ftbench-forkserver-{os.getuid()}"
    if len(str(path)) > 75:
        path = Path("/tmp") / path.name
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


class Child:
    """The forked child as the supervisor sees a subprocess.Popen: pid (its session), poll(), wait(),
    returncode (negative: the signal that killed it). Its waiter in the server sends one JSON line with the pid,
    then one with the exit status."""

    def __init__(self, conn: socket.socket):
        self.conn, self.pid, self.returncode, self._buf = conn, None, None, b""

    def _read(self, timeout):
        """The waiter's next message; None when none came within `timeout`; {} when the waiter is gone."""
        while b"\n" not in self._buf:
            ready, _, _ = select.select([self.conn], [], [], timeout)
            if not ready:
                return None
            chunk = self.conn.recv(4096)
            if not chunk:
                return {}
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return json.loads(line)

    def wait(self, timeout=None):
        if self.returncode is None:
            msg = self._read(timeout)
            if msg is None:
                raise subprocess.TimeoutExpired("forked child", timeout)
            self.returncode = msg.get("returncode", -9)  # a waiter gone: the child's fate unknown, as if killed
            self.conn.close()
        return self.returncode

    def poll(self):
        try:
            return self.wait(0)
        except subprocess.TimeoutExpired:
            return None


def _connect(path: Path) -> socket.socket | None:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(str(path))
        return s
    except OSError:
        s.close()
        return None


def _start_server(path: Path, env: dict, wait_s: float) -> socket.socket:
    """Start the server for `path` (its own session, not the job's) and wait until it listens."""
    server_env = {k: v for k, v in env.items() if k not in ("FTBENCH_PROGRESS", "CUDA_VISIBLE_DEVICES")}
    server_env["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"  # torch.cuda.is_available() without initializing CUDA
    log = open(path.with_suffix(".log"), "a")
    proc = subprocess.Popen([sys.executable, "-m", "ftbench.run.forkserver", str(path)], env=server_env,
                            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    log.close()
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        conn = _connect(path)
        if conn is not None:
            return conn
        if proc.poll() is not None:
            raise Unavailable(f"the fork server exited with code {proc.returncode} (log: {path.with_suffix('.log')})")
        time.sleep(0.1)
    raise Unavailable(f"the fork server did not listen within {wait_s:g} s")


def spawn(argv: list[str], env: dict, log_path, wait_s: float = 180.0) -> Child:
    """Have the matching server fork `python -m <argv>` (argv[0] a module name) for this job; start the
    server first where none runs. Raises Unavailable where it cannot."""
    cwd = os.getcwd()
    path = _socket_dir() / f"{key(env, cwd)}.sock"
    try:
        conn = _connect(path)
        if conn is None:
            with open(path.with_suffix(".lock"), "w") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)  # one job starts the server; the others wait and use it
                conn = _connect(path) or _start_server(path, env, wait_s)
        conn.sendall(json.dumps({"argv": argv, "env": env, "cwd": cwd,
                                 "log": str(Path(log_path).resolve())}).encode() + b"\n")
        child = Child(conn)
        msg = child._read(wait_s)
        if not msg or "pid" not in msg:
            conn.close()
            raise Unavailable("the fork server started no child" + (" in time" if msg is None else ""))
        child.pid = msg["pid"]
        return child
    except (OSError, ValueError) as e:
        raise Unavailable(f"{type(e).__name__}: {e}") from e


# ---------------------------------------------------------------------------------------------------- server

def _run_child(request: dict) -> None:
    """In the forked child: become the job's own process and run its module as __main__."""
    import runpy

    os.setsid()  # its own session: the supervisor's kill and memory accounting by session work as before
    for sig in (signal.SIGCHLD, signal.SIGTERM):  # SIGPIPE stays ignored, as Python starts with it
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # what a fresh interpreter has
    fd = os.open(request["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    os.close(null)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    sys.argv = [request["argv"][0], *request["argv"][1:]]
    code = 0
    try:
        runpy.run_module(request["argv"][0], run_name="__main__", alter_sys=True)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
    os._exit(code)


def _serve_one(conn: socket.socket, listener: socket.socket) -> int:
    """Fork the waiter for one request: it forks the child, reports its pid, waits, reports its exit."""
    waiter = os.fork()
    if waiter:
        conn.close()
        return waiter
    try:
        listener.close()
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the server ignores it; the waiter must reap its child
        buf = b""
        while b"\n" not in buf:
            chunk = conn.recv(65536)
            if not chunk:
                os._exit(0)
            buf += chunk
        request = json.loads(buf.split(b"\n", 1)[0])
        sys.stdout.flush()
        sys.stderr.flush()
        child = os.fork()
        if child == 0:
            conn.close()
            _run_child(request)
        conn.sendall(json.dumps({"pid": child}).encode() + b"\n")
        _, status = os.waitpid(child, 0)
        rc = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        try:
            conn.sendall(json.dumps({"returncode": rc}).encode() + b"\n")
        except OSError:
            pass
    except BaseException:
        traceback.print_exc()
    os._exit(0)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False


def serve(path: str) -> None:
    import importlib

    idle_s = float(os.environ.get("FTBENCH_FORKSERVER_IDLE_S", "60"))  # read first: a bad value fails fast
    t0 = time.monotonic()
    for name in PRELOAD:
        try:
            module = importlib.import_module(name)
            for attr in PRELOAD_ATTRS.get(name, ()):
                getattr(module, attr, None)
        except Exception as e:  # that job's child imports it itself
            print(f"preload {name}: {type(e).__name__}: {e}", flush=True)
    import threading

    import torch

    if torch.cuda.is_initialized():
        print("CUDA was initialized while importing: a forked child could not use it; not serving", flush=True)
        sys.exit(3)
    if threading.active_count() > 1:  # a fork copies no other thread: a lock one held would stay held
        print(f"{threading.active_count()} threads after importing: not serving", flush=True)
        sys.exit(3)
    print(f"preloaded in {time.monotonic() - t0:.1f} s; serving at {path} (pid {os.getpid()})", flush=True)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # waiters are reaped as they end
    if os.path.exists(path) and not _connect(Path(path)):  # a stale socket file of a server that died
        os.unlink(path)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    ours = os.stat(path).st_ino
    listener.listen(64)
    waiters, last = set(), time.monotonic()
    try:
        while True:
            ready, _, _ = select.select([listener], [], [], 1.0)
            if ready:
                conn, _ = listener.accept()
                waiters.add(_serve_one(conn, listener))
                last = time.monotonic()
            waiters = {w for w in waiters if _alive(w)}
            if waiters:
                last = time.monotonic()
            elif time.monotonic() - last > idle_s:
                print(f"idle {idle_s:g} s: leaving", flush=True)
                return
    finally:
        try:  # only our own socket file: a server started after us may have bound the same name
            if os.stat(path).st_ino == ours:
                os.unlink(path)
        except FileNotFoundError:
            pass


if __name__ == "__main__":
    serve(sys.argv[1])
