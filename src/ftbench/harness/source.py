"""Which code ran: a digest of the files that shape a measurement, computed from the files themselves at run time,
and whether they are the files of the commit git names.

Git metadata can be stale or absent where a run happens (a copied working tree on a lent GPU, a tarball on a
cluster), so `git rev-parse HEAD` alone can name code that did not run. Each shaping file is identified by its git
blob id (sha1 of "blob <size>\\0<content>"; a symbolic link by its target, as git stores it), and the digest is the
sha256 of the sorted "path blob-id" lines. The commit's own digest comes from `git ls-tree` over the same paths, with
no file read, so the two are comparable line for line and the files that differ can be named.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

# what shapes a measurement: the library, the rules and scripts that call it, the configs and the Snakefile
SHAPING = ("src", "rules", "workflow", "config", "Snakefile")
SKIP_DIRS = {"__pycache__"}
SKIP_SUFFIXES = (".pyc", ".pyo", ".egg-info")
LISTED = 8  # changed files named in the note


def library_first(src, environ=None) -> dict:
    """Put the library folder `src` first on the PYTHONPATH of `environ` (default: this process's, which the
    workflow's jobs inherit), so that the jobs import the library of the files they run and their records' digest
    names: a job script puts its own folder last on its path, behind an installed copy of the library or one a
    PYTHONPATH names. Returns `environ`."""
    environ = os.environ if environ is None else environ
    environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(src), environ.get("PYTHONPATH", "")) if p)
    return environ


def blob_id(data: bytes) -> str:
    """git's id of a file's content."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _kept(name: str) -> bool:
    return not name.startswith(".") and name not in SKIP_DIRS and not name.endswith(SKIP_SUFFIXES)


def file_blobs(base_dir) -> dict[str, str]:
    """{relative path: blob id} of every shaping file under `base_dir` (links not followed: a link is its target)."""
    base = Path(base_dir)
    blobs = {}
    for top in SHAPING:
        root = base / top
        if root.is_symlink() or root.is_file():
            blobs[top] = _blob_of(root)
            continue
        for folder, dirs, files in os.walk(root):
            dirs[:] = sorted(d for d in dirs if _kept(d) and not (Path(folder) / d).is_symlink())
            links = [d for d in os.listdir(folder) if (Path(folder) / d).is_symlink() and _kept(d)]
            for name in sorted(set(f for f in files if _kept(f)) | set(links)):
                path = Path(folder) / name
                blobs[path.relative_to(base).as_posix()] = _blob_of(path)
    return blobs


def _blob_of(path: Path) -> str:
    return blob_id(os.readlink(path).encode() if path.is_symlink() else path.read_bytes())


def digest(blobs: dict[str, str]) -> str:
    return hashlib.sha256("".join(f"{p} {b}\n" for p, b in sorted(blobs.items())).encode()).hexdigest()[:16]


def commit_blobs(base_dir) -> tuple[str, dict[str, str]] | None:
    """(commit, {path: blob id}) of the shaping files in git's HEAD, or None where there is no git history."""
    try:
        sha = _git(base_dir, "rev-parse", "HEAD").strip()
        listing = _git(base_dir, "ls-tree", "-r", "HEAD", "--", *SHAPING)
    except (OSError, subprocess.CalledProcessError):
        return None
    blobs = {}
    for line in listing.splitlines():
        meta, path = line.split("\t", 1)
        mode, kind, blob = meta.split()
        if kind == "blob" and all(_kept(part) for part in path.split("/")):
            blobs[path] = blob
    return sha, blobs


def _git(base_dir, *args) -> str:
    return subprocess.run(["git", *args], cwd=base_dir, capture_output=True, text=True, check=True).stdout


def code_identity(base_dir) -> dict:
    """The record's account of the code that ran: the files' digest, the commit git names and its digest over the
    same paths, whether they match, and a plain sentence saying so (with the files that differ)."""
    files = file_blobs(base_dir)
    out = {"source_digest": digest(files), "git_commit": None, "commit_source_digest": None,
           "source_matches_commit": None, "source_changed_files": None}
    if not files:  # nothing to name the code by (the folder read while its files were being replaced, say)
        out.update(source_digest=None, source_note=f"no source files found under {base_dir}: the code is unknown")
        return out
    head = commit_blobs(base_dir)
    if head is None:
        out["source_note"] = f"no git history: the files' digest {out['source_digest']} names the code"
        return out
    sha, committed = head
    changed = sorted(p for p in files.keys() | committed.keys() if files.get(p) != committed.get(p))
    out.update(git_commit=sha, commit_source_digest=digest(committed), source_matches_commit=not changed,
               source_changed_files=changed or None)
    if changed:
        named = ", ".join(changed[:LISTED]) + (f" and {len(changed) - LISTED} more" if len(changed) > LISTED else "")
        out["source_note"] = (f"the files that ran (digest {out['source_digest']}) are not commit {sha[:10]}'s "
                              f"(digest {out['commit_source_digest']}): {len(changed)} file(s) differ: {named}")
    else:
        out["source_note"] = f"the files of commit {sha[:10]} (digest {out['source_digest']})"
    return out


def short_code(prov: dict) -> str | None:
    """A table cell naming the code of a record's provenance: "04dc138a12 (= files a1b2...)" or, where the files were
    not the commit's, "04dc138a12 + 3 changed (files a1b2...)"; older records: their git_commit as written."""
    if not prov.get("source_digest"):
        return prov.get("git_commit")
    commit = (prov.get("git_commit") or "no git")[:10]
    if prov.get("source_matches_commit") is False:
        return f"{commit} + {len(prov.get('source_changed_files') or [])} changed (files {prov['source_digest']})"
    return f"{commit} (files {prov['source_digest']})"
