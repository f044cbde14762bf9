"""Provenance of a stored run: the code state, the machine and the versions, and what makes a run unfit to
back a published table (labkit.provenance)."""

import subprocess
import sys

from labkit import provenance


def test_collect_names_code_host_versions_and_what_the_caller_passes():
    p = provenance.collect(config={"transport": "colocated"}, seeds=[10, 11])
    assert len(p["commit"]) == 40 and isinstance(p["dirty"], bool)
    assert p["date_utc"].endswith("+00:00")
    assert p["host"]["cores"] >= 1 and p["host"]["memory_gib"] > 0 and p["host"]["cpu_model"]
    assert p["versions"]["python"] and "torch" in p["versions"] and "sglang" in p["versions"]
    assert p["config"] == {"transport": "colocated"} and p["seeds"] == [10, 11]


def test_collect_imports_no_heavy_library():
    code = ("import sys; from labkit import provenance; provenance.collect(); "
            "print(sorted(m for m in ('torch', 'ray', 'sglang') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_a_dirty_tree_a_missing_commit_or_no_provenance_is_a_problem(tmp_path, monkeypatch):
    clean = {"provenance": {"commit": "a" * 40, "dirty": False}}
    assert provenance.problems(clean) == []
    assert provenance.problems({"provenance": {"commit": "a" * 40, "dirty": True}}) == ["made from a dirty tree"]
    assert provenance.problems({"provenance": {"commit": None, "dirty": False}}) == ["no commit"]
    assert provenance.problems({"command": "labkit bench sync"}) == ["no provenance"]


def test_dirty_means_a_code_change_not_a_stored_run(tmp_path, monkeypatch):
    repo = tmp_path / "repo"
    (repo / "data").mkdir(parents=True)
    (repo / "code.py").write_text("x = 1\n")
    (repo / "data" / "run.json").write_text("{}\n")
    git = ["git", "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run([*git, "-C", str(repo), "add", "."], check=True)
    subprocess.run([*git, "-C", str(repo), "commit", "-qm", "c"], check=True)
    monkeypatch.setattr(provenance, "ROOT", repo)
    assert provenance.code_state()["dirty"] is False
    (repo / "data" / "run.json").write_text('{"new": 1}\n')
    assert provenance.code_state()["dirty"] is False  # a re-made stored run is not a code change
    (repo / "code.py").write_text("x = 2\n")
    assert provenance.code_state()["dirty"] is True


def test_a_tree_without_its_git_is_checked_against_the_manifest_written_before_it_left(tmp_path, monkeypatch):
    repo = tmp_path / "repo"
    (repo / "data").mkdir(parents=True)
    (repo / "code.py").write_text("x = 1\n")
    (repo / "data" / "run.json").write_text("{}\n")
    git = ["git", "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run([*git, "-C", str(repo), "add", "."], check=True)
    subprocess.run([*git, "-C", str(repo), "commit", "-qm", "c"], check=True)
    head = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    monkeypatch.setattr(provenance, "ROOT", repo)
    provenance.write_manifest()
    subprocess.run(["rm", "-rf", str(repo / ".git")], check=True)  # the tree as it arrives on the device machine
    assert provenance.code_state() == {"commit": head, "dirty": False}
    (repo / "data" / "run.json").write_text('{"new": 1}\n')
    assert provenance.code_state()["dirty"] is False
    (repo / "code.py").write_text("x = 2\n")
    assert provenance.code_state() == {"commit": head, "dirty": True}
    (repo / "code.py").unlink()
    assert provenance.code_state()["dirty"] is True


def test_a_manifest_beside_an_older_git_head_names_the_commit_whose_bytes_are_there(tmp_path, monkeypatch):
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "code.py").write_text("x = 1\n")
    git = ["git", "-c", "user.email=t@t", "-c", "user.name=t", "-C", str(repo)]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "old"], check=True)
    old = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    (repo / "code.py").write_text("x = 2\n")
    subprocess.run([*git, "commit", "-qam", "new"], check=True)
    new = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    monkeypatch.setattr(provenance, "ROOT", repo)
    provenance.write_manifest()
    subprocess.run([*git, "reset", "-q", "--soft", old], check=True)  # the device's .git: the session's first HEAD
    assert provenance.code_state() == {"commit": new, "dirty": False}
    (repo / "code.py").write_text("x = 3\n")  # neither commit's bytes: dirty, as git says
    assert provenance.code_state()["dirty"] is True
