#!/usr/bin/env python3
"""The device kit: every wheel scripts/gpu_check.py needs on a GPU machine that has torch and nothing else of
judgetrain's stack, gathered here from PyPI ahead of the loan, and checked by an offline install.

    python scripts/device_kit.py [--out wheels] [--pythons 3.10,3.11,3.12,3.13] [--max_mib 60]

1. The packages: the installed dependency closure of trl, transformers, peft, accelerate, datasets, huggingface_hub
   (whose 2.x client needs httpx2 and httpcore2) and judgetrain's own direct dependencies, at the versions this
   environment runs (the versions the tests ran on), less torch and what only torch needs (the device brings them),
   and less ``DEVICE_PROVIDES`` (numpy, pandas, pyarrow: 84 MB of wheels together, more than a device call carries;
   the device's install step checks they are there and says so first when they are not).
2. ``pip download --no-deps --only-binary=:all:`` of each, for every Python version in ``--pythons`` (a compiled wheel
   is built for one version; a pure-Python one serves all), manylinux x86_64; a package PyPI has no wheel of is built
   with ``pip wheel``. ``requirements.txt`` pins the top packages; ``kit.json`` lists what is in the kit and what the
   device must have.
3. The size: the folder must fit ``--max_mib`` (a device call carries 64 MiB in all; the checkout's own files travel
   beside it).
4. The check: an empty venv of this Python, given torch and ``DEVICE_PROVIDES`` the way a device has them (this
   environment's copies on a .pth path: nothing else), installs ``requirements.txt`` from the folder with
   ``--no-index`` and imports judgetrain (from the checkout, as gpu_check runs it), trl, datasets, huggingface_hub,
   transformers, peft and accelerate.

Exit 0 when the kit is complete, fits and installs; 1 otherwise, naming what failed. ``--check_only`` checks an
existing folder. On the device, ``python scripts/gpu_check.py --wheels wheels`` installs from it before the checks.
"""

from __future__ import annotations

import argparse
import importlib.metadata as metadata
import json
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parent.parent
# What gpu_check imports beyond torch: the training stack and judgetrain's direct dependencies (matplotlib and the
# test extras are not needed by the checks)
ROOTS = ("trl", "transformers", "peft", "accelerate", "datasets", "huggingface_hub", "tokenizers", "pyyaml",
         "filelock", "rich", "jinja2")
# Pinned in requirements.txt: the stack whose versions the checks are about
PINNED = ("trl", "transformers", "peft", "accelerate", "datasets", "huggingface_hub")
# The device brings torch and what only torch needs
TORCH_ONLY = ("torch", "triton", "sympy", "mpmath", "networkx", "setuptools")
# Too large for a device call's carry (numpy 17 MB, pandas 12 MB, pyarrow 55 MB as cp311 wheels): the device must have
# them (a GPU image with torch has numpy; the H200 of the first loan had pandas and pyarrow too)
DEVICE_PROVIDES = ("numpy", "pandas", "pyarrow")
IMPORTS = ("judgetrain", "trl", "datasets", "huggingface_hub", "transformers", "peft", "accelerate")
PLATFORMS = ("manylinux2014_x86_64", "manylinux_2_17_x86_64", "manylinux_2_28_x86_64", "manylinux_2_34_x86_64")


def closure(roots=ROOTS, skip=TORCH_ONLY + DEVICE_PROVIDES) -> dict[str, str]:
    """{package: installed version} of ``roots`` and everything they require (markers evaluated for this Python,
    extras not taken), less ``skip`` and NVIDIA's CUDA libraries."""
    found: dict[str, str] = {}
    todo = list(roots)
    while todo:
        name = canonicalize_name(todo.pop())
        if name in found or name in skip or name.startswith("nvidia-"):
            continue
        dist = metadata.distribution(name)
        found[name] = dist.version
        for line in dist.requires or []:
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return dict(sorted(found.items()))


def download(packages: dict[str, str], out: Path, pythons: list[str]) -> list[str]:
    """Wheels of ``packages`` into ``out`` for each Python version; the names PyPI had no wheel of, built locally."""
    out.mkdir(parents=True, exist_ok=True)
    platforms = [x for p in PLATFORMS for x in ("--platform", p)]
    built = []
    for name, version in packages.items():
        for python in pythons:
            cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                   "--python-version", python, "--implementation", "cp", *platforms, "--dest", str(out),
                   f"{name}=={version}"]
            if subprocess.run(cmd, capture_output=True, text=True).returncode != 0:
                if name in built:
                    continue
                # no wheel on PyPI for this version: build one (pure Python ones serve every version)
                subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", str(out),
                                f"{name}=={version}"], check=True)
                built.append(name)
            elif any(w.name.endswith("-none-any.whl") for w in out.glob(f"{wheel_stem(name)}-{version}-*.whl")):
                break  # a pure-Python wheel: one serves every Python
    return built


def wheel_stem(name: str) -> str:
    return canonicalize_name(name).replace("-", "_")


def folder_mib(out: Path) -> float:
    return sum(f.stat().st_size for f in out.iterdir() if f.is_file()) / 2**20


def write_manifest(out: Path, packages: dict[str, str], pythons: list[str], built: list[str]) -> dict:
    """requirements.txt (the pinned stack) and kit.json (what is in the kit, for which Pythons, what the device must
    have)."""
    (out / "requirements.txt").write_text("".join(f"{n}=={packages[canonicalize_name(n)]}\n" for n in PINNED))
    manifest = {"packages": packages, "pythons": pythons, "built_locally": built,
                "device_must_have": {n: metadata.version(n) for n in DEVICE_PROVIDES} | {"torch": ">=2.8"},
                "imports": list(IMPORTS), "mib": round(folder_mib(out), 1)}
    (out / "kit.json").write_text(json.dumps(manifest, indent=1))
    return manifest


def device_like_site(into: Path, names=("torch",) + DEVICE_PROVIDES) -> None:
    """A folder holding, as links into this environment, what a GPU machine's Python has: torch and
    ``DEVICE_PROVIDES`` with everything they require; nothing else of the kit."""
    into.mkdir(parents=True, exist_ok=True)
    todo, done = list(names), set()
    while todo:
        name = canonicalize_name(todo.pop())
        if name in done or name.startswith("nvidia-"):
            continue
        done.add(name)
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        todo += [Requirement(x).name for x in dist.requires or []  # what they need, as installed beside them
                 if Requirement(x).marker is None or Requirement(x).marker.evaluate({"extra": ""})]
        site = Path(dist.locate_file(""))
        for top in {Path(f).parts[0] for f in dist.files or [] if not str(f).startswith("..")}:
            target = into / top
            if not target.exists() and (site / top).exists():
                target.symlink_to(site / top)


def verify(out: Path) -> dict:
    """An offline install of the kit into an empty venv that has only what a device has, then the imports."""
    with tempfile.TemporaryDirectory() as tmp:
        venv, device = Path(tmp) / "venv", Path(tmp) / "device"
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        # the venv's own setuptools (ensurepip's) would shadow the device's, which torch requires at a newer version
        subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "uninstall", "--quiet", "-y", "setuptools"],
                       capture_output=True)
        device_like_site(device)
        python = venv / "bin" / "python"
        purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                 capture_output=True, text=True, check=True).stdout.strip()
        (Path(purelib) / "device.pth").write_text(str(device) + "\n")
        before = subprocess.run([str(python), "-c", "import importlib.util as u; print([m for m in "
                                 f"{list(IMPORTS[1:])!r} if u.find_spec(m)])"], capture_output=True, text=True,
                                check=True).stdout.strip()
        install = subprocess.run([str(python), "-m", "pip", "install", "--no-index", "--find-links", str(out),
                                  "-r", str(out / "requirements.txt")], capture_output=True, text=True)
        if install.returncode != 0:
            return {"ok": False, "error": "offline install failed: " + (install.stdout + install.stderr)[-2000:]}
        code = ("import importlib, json; print(json.dumps({m: getattr(importlib.import_module(m), '__version__', '?') "
                f"for m in {list(IMPORTS)!r}}}))")
        imports = subprocess.run([str(python), "-c", code], capture_output=True, text=True, cwd=REPO,
                                 env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"})
        if imports.returncode != 0:
            return {"ok": False, "error": "imports failed: " + imports.stderr[-2000:]}
        return {"ok": True, "importable_before": before, "versions": json.loads(imports.stdout.splitlines()[-1])}


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=REPO / "wheels",
                   help="the kit's folder (default: wheels/ in the checkout)")
    p.add_argument("--pythons", default="3.10,3.11,3.12,3.13",
                   help="Python versions to fetch compiled wheels for (default: 3.10,3.11,3.12,3.13)")
    p.add_argument("--max_mib", type=float, default=60.0, help="the most the folder may take (default: 60)")
    p.add_argument("--check_only", action="store_true", help="check an existing folder: size, offline install, imports")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse(argv)
    this = f"{sys.version_info.major}.{sys.version_info.minor}"
    pythons = [v.strip() for v in args.pythons.split(",") if v.strip()]
    if this not in pythons:
        pythons.append(this)  # the offline check installs into this Python
    if not args.check_only:
        packages = closure()
        print(f"device_kit: {len(packages)} packages: {', '.join(f'{n} {v}' for n, v in packages.items())}",
              file=sys.stderr)
        built = download(packages, args.out, pythons)
        manifest = write_manifest(args.out, packages, pythons, built)
    else:
        manifest = json.loads((args.out / "kit.json").read_text())
    mib = folder_mib(args.out)
    print(f"device_kit: {args.out}: {mib:.1f} MiB (limit {args.max_mib:g})", file=sys.stderr)
    if mib > args.max_mib:
        largest = sorted(args.out.glob("*.whl"), key=lambda f: -f.stat().st_size)[:5]
        print("device_kit: over the limit; largest: " + ", ".join(f"{f.name} {f.stat().st_size / 2**20:.1f} MiB"
                                                                 for f in largest), file=sys.stderr)
        return 1
    result = verify(args.out)
    manifest["verified"] = {**result, "python": this, "platform": sysconfig.get_platform()}
    (args.out / "kit.json").write_text(json.dumps(manifest, indent=1))
    if not result["ok"]:
        print(f"device_kit: {result['error']}", file=sys.stderr)
        return 1
    print(f"device_kit: installs offline into an empty venv holding only torch and {', '.join(DEVICE_PROVIDES)}; "
          f"imports {result['versions']}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
