"""Branches are created with plumbing: the user's tree, index and HEAD never move."""

import subprocess

import pytest

from agent import gitops


def git(repo, *args):
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout


@pytest.fixture
def user_repo(tmp_path):
    path = tmp_path / "user"
    path.mkdir()
    git(path, "init", "-q", "-b", "main")
    git(path, "config", "user.email", "u@example.com")
    git(path, "config", "user.name", "user")
    (path / "app.py").write_text("print('hi')\n")
    git(path, "add", "app.py")
    git(path, "commit", "-q", "-m", "first")
    (path / "app.py").write_text("print('work in progress')\n")  # an uncommitted change
    (path / "staged.txt").write_text("staged\n")
    git(path, "add", "staged.txt")
    return path


def test_proposal_branch_leaves_the_users_tree_index_and_head_alone(user_repo):
    before = (git(user_repo, "status", "--porcelain"), git(user_repo, "rev-parse", "HEAD"),
              git(user_repo, "symbolic-ref", "HEAD"), (user_repo / "app.py").read_text())
    repo = gitops.open_repo(user_repo)
    sha = gitops.commit_branch(repo, "agent/r1/3", {"serving/config.yaml": ("max-num-seqs: 8\n", False),
                                               "serving/launch.sh": ("#!/bin/sh\n", True)}, "trial 3: 1.3x")
    after = (git(user_repo, "status", "--porcelain"), git(user_repo, "rev-parse", "HEAD"),
             git(user_repo, "symbolic-ref", "HEAD"), (user_repo / "app.py").read_text())
    assert before == after
    assert git(user_repo, "rev-parse", "agent/r1/3").strip() == sha
    assert git(user_repo, "show", "agent/r1/3:serving/config.yaml") == "max-num-seqs: 8\n"
    assert git(user_repo, "show", "agent/r1/3:app.py") == "print('hi')\n"   # the committed file, not the WIP
    assert "100755" in git(user_repo, "ls-tree", "agent/r1/3", "serving/launch.sh")
    assert git(user_repo, "log", "-1", "--format=%s", "agent/r1/3").strip() == "trial 3: 1.3x"
    assert gitops.branches(repo) == ["agent/r1/3"]


def test_existing_branch_is_never_overwritten(user_repo):
    repo = gitops.open_repo(user_repo)
    first = gitops.commit_branch(repo, "agent/r1/1", {"a": ("1", False)}, "one")
    with pytest.raises(gitops.RepoError, match="already exists"):
        gitops.commit_branch(repo, "agent/r1/1", {"a": ("2", False)}, "two")
    assert git(user_repo, "rev-parse", "agent/r1/1").strip() == first


def test_works_on_a_detached_head_with_hooks_that_would_fail(user_repo):
    git(user_repo, "checkout", "-q", "--detach")
    hook = user_repo / ".git" / "hooks" / "pre-commit"
    hook.write_text("#!/bin/sh\nexit 1\n")
    hook.chmod(0o755)
    repo = gitops.open_repo(user_repo)
    gitops.commit_branch(repo, "agent/r2/1", {"a": ("x", False)}, "m")
    assert git(user_repo, "show", "agent/r2/1:a") == "x"


def test_not_a_repository_and_created_repository(tmp_path):
    with pytest.raises(gitops.RepoError, match="is not a git repository"):
        gitops.open_repo(tmp_path)
    repo = gitops.open_repo(tmp_path / "new", create=True)
    assert repo.head.commit.message.startswith("Start the repository")


def test_mid_merge_with_signing_required_and_a_stale_index_lock(user_repo):
    """The user's repository in the middle of a conflicted merge, with commit signing on (and no
    key) and an index.lock left by a crashed git: a proposal still lands, and none of it moves."""
    git(user_repo, "stash", "-q")
    git(user_repo, "checkout", "-q", "-b", "other")
    (user_repo / "app.py").write_text("print('other')\n")
    git(user_repo, "commit", "-qam", "other")
    git(user_repo, "checkout", "-q", "main")
    (user_repo / "app.py").write_text("print('main')\n")
    git(user_repo, "commit", "-qam", "main")
    subprocess.run(["git", "-C", str(user_repo), "merge", "other"], capture_output=True)   # conflicts
    assert (user_repo / ".git" / "MERGE_HEAD").exists()
    git(user_repo, "config", "commit.gpgsign", "true")
    git(user_repo, "config", "user.signingkey", "NO-SUCH-KEY")
    (user_repo / ".git" / "index.lock").write_text("")
    before = ((user_repo / "app.py").read_text(), git(user_repo, "rev-parse", "HEAD"))
    repo = gitops.open_repo(user_repo)
    sha = gitops.commit_branch(repo, "agent/r3/1", {"serving/config.yaml": ("a: 1\n", False)}, "trial 1")
    assert git(user_repo, "rev-parse", "agent/r3/1").strip() == sha
    assert ((user_repo / "app.py").read_text(), git(user_repo, "rev-parse", "HEAD")) == before
    assert (user_repo / ".git" / "MERGE_HEAD").exists() and (user_repo / ".git" / "index.lock").exists()
