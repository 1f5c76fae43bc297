"""Proposals as git branches, written without touching the user's working tree, index or HEAD.

Each accepted candidate becomes `agent/<run-id>/<trial>` off the repository's current HEAD,
built with plumbing: blobs and a tree through a private index file, a commit with commit-tree,
and the ref created by update-ref with an all-zero old value, so an existing branch (ours from an
earlier attempt, or anyone's) is never overwritten. A later commit on such a branch (what the win is
worth, `agent run --capacity`) moves it only from the commit the ledger names.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import git

PREFIX = "agent/"
ZERO = "0" * 40
IDENTITY = {"GIT_AUTHOR_NAME": "agent", "GIT_AUTHOR_EMAIL": "agent@localhost",
            "GIT_COMMITTER_NAME": "agent", "GIT_COMMITTER_EMAIL": "agent@localhost"}


class RepoError(ValueError):
    pass


def open_repo(path: Path, create: bool = False) -> git.Repo:
    """The repository to propose into; created with a first commit when create is set."""
    path = Path(path)
    if create and not path.exists():
        path.mkdir(parents=True)
        repo = git.Repo.init(path, initial_branch="main")
        (path / "README.md").write_text("# serving configs\n\nBranches `agent/<run>/<trial>` hold proposals.\n")
        repo.git.add("README.md")
        repo.git.commit("-m", "Start the repository that agent proposes serving configs into",
                        "--no-gpg-sign", "--no-verify", env={**os.environ, **IDENTITY})
        return repo
    try:
        repo = git.Repo(path)
    except (git.InvalidGitRepositoryError, git.NoSuchPathError):
        raise RepoError(f"{path} is not a git repository") from None
    if repo.bare:
        raise RepoError(f"{path} is a bare repository")
    try:
        _ = repo.head.commit   # raises where the repository has no commit yet
    except ValueError:
        raise RepoError(f"{path} has no commits to branch from") from None
    return repo


def namespace_clash(repo: git.Repo, run_id: str | None = None) -> str | None:
    """Why no branch agent/<run>/<n> could be created in repo, or None: a branch named `agent` (git keeps
    a ref and a folder of refs apart, so every `update-ref refs/heads/agent/...` would fail), one named
    after the run itself, or a repository this process cannot write. Checked before a night starts."""
    where = repo.working_dir or repo.git_dir
    names = {h.name for h in repo.heads}
    stem = PREFIX.rstrip("/")
    if stem in names:
        return (f"{where}: its branch {stem!r} keeps every branch {PREFIX}<run>/<n> from being created (a ref "
                f"cannot also be a folder of refs); rename it (git branch -m {stem} <name>) or give another --repo")
    if run_id and f"{PREFIX}{run_id}" in names:
        return (f"{where}: its branch {PREFIX}{run_id!r} keeps run {run_id}'s branches {PREFIX}{run_id}/<n> "
                f"from being created; rename it or give another --repo")
    for folder in ("objects", "refs/heads"):
        if not os.access(Path(repo.git_dir) / folder, os.W_OK):
            return f"{where}: {Path(repo.git_dir) / folder} is not writable, so no branch could be committed"
    return None


def commit_branch(repo: git.Repo, branch: str, files: dict[str, tuple[str, bool]], message: str) -> str:
    """Commit files ({path: (text, executable)}) on top of HEAD as a new branch; return the commit."""
    if not branch.startswith(PREFIX):
        raise RepoError(f"branch {branch!r} is not under {PREFIX}")
    commit = _commit(repo, repo.head.commit.hexsha, files, message)
    _move(repo, branch, commit, ZERO)   # create only; never overwrite
    return commit


def add_commit(repo: git.Repo, branch: str, parent: str, files: dict[str, tuple[str, bool]], message: str) -> str:
    """Commit files on top of `parent`, the branch's head as the ledger names it, and move the branch
    there only if it is still at `parent` (a branch moved by anyone since is left alone: RepoError)."""
    if not branch.startswith(PREFIX):
        raise RepoError(f"branch {branch!r} is not under {PREFIX}")
    commit = _commit(repo, parent, files, message)
    _move(repo, branch, commit, parent)
    return commit


def _commit(repo: git.Repo, parent: str, files: dict[str, tuple[str, bool]], message: str) -> str:
    """A commit of parent's tree with files written over it, made without touching the user's index."""
    env = {**os.environ, **IDENTITY}
    with tempfile.TemporaryDirectory() as tmp:
        env["GIT_INDEX_FILE"] = str(Path(tmp) / "index")  # a private index: the user's stays untouched
        repo.git.read_tree(parent, env=env)
        for rel, (content, executable) in sorted(files.items()):
            blob_path = Path(tmp) / "blob"
            blob_path.write_text(content)
            blob = repo.git.hash_object("-w", "--no-filters", str(blob_path))
            mode = "100755" if executable else "100644"
            repo.git.update_index("--add", "--cacheinfo", f"{mode},{blob},{rel}", env=env)
        tree = repo.git.write_tree(env=env)
    return repo.git.commit_tree(tree, "-p", parent, "-m", message, "--no-gpg-sign", env=env)


def _move(repo: git.Repo, branch: str, commit: str, was: str) -> None:
    """The branch to commit, only where it is at `was` (ZERO: only where it does not exist)."""
    try:
        repo.git.update_ref(f"refs/heads/{branch}", commit, was)
    except git.GitCommandError as e:
        said = "; ".join(line.strip() for line in str(e.stderr).strip().strip("'").splitlines() if line.strip())
        said = said.removeprefix("stderr: ").strip("'")[:200]
        if was == ZERO and any(h.name == branch for h in repo.heads):
            raise RepoError(f"branch {branch} already exists; not overwritten ({said})") from None
        if was != ZERO:
            raise RepoError(f"branch {branch} is no longer at {was[:10]}; not moved ({said})") from None
        raise RepoError(f"branch {branch} could not be created: {said}") from None


def branches(repo: git.Repo) -> list[str]:
    return sorted(h.name for h in repo.heads if h.name.startswith(PREFIX))
