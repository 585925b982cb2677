"""Builds the client's optional native read path (``sluice._native``, the
crate in ``native/``) with cargo while the package is built.

Everything else is pure Python (pyproject.toml). Without the extension the
client works the same, only slower per call (docs/performance.md).

``SLUICE_NATIVE_BUILD``:
  ``auto`` (default) build it if cargo is found; if the build fails, say so
           and install the pure-Python client.
  ``required`` fail the install if it cannot be built (CI).
  ``0``     do not build it.
``SLUICE_NATIVE_PROFILE``: ``release`` (default) or ``debug`` (a quicker
build for tests that reuses a debug workspace build).
``SLUICE_NATIVE_LIB``: the path of an extension cargo built already (the
workspace's ``lib_native.so``, as ``scripts/test`` builds it with the rest):
installed as it is, nothing built here.

``python3 setup.py --native-inplace`` builds it into ``src/sluice`` for a
client run from its source folder.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
MANIFEST = HERE / "native" / "Cargo.toml"


def _cargo() -> "str | None":
    found = shutil.which("cargo")
    if found:
        return found
    home = Path(os.environ.get("CARGO_HOME", Path.home() / ".cargo")) / "bin" / "cargo"
    return str(home) if home.exists() else None


def _build_native(out_dir: Path) -> None:
    # An extension left by an earlier build must not ship with this one.
    for stale in (out_dir / "sluice").glob("_native*.so"):
        stale.unlink()
    mode = os.environ.get("SLUICE_NATIVE_BUILD", "auto")
    if mode == "0":
        print("sluice: SLUICE_NATIVE_BUILD=0: installing the pure-Python client", file=sys.stderr)
        return
    built = os.environ.get("SLUICE_NATIVE_LIB")
    if built:
        dest = out_dir / "sluice" / "_native.abi3.so"
        try:
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(built, dest)
            print(f"sluice: installing the native read path built at {built}", file=sys.stderr)
            return
        except OSError as e:
            why = f"SLUICE_NATIVE_LIB={built}: {e}"
            if mode == "required":
                raise SystemExit(f"sluice: SLUICE_NATIVE_BUILD=required, but the native read path was not built: {why}")
            print(f"sluice: WARNING: no native read path ({why}); installing the pure-Python client", file=sys.stderr)
            return
    cargo = _cargo()
    why = None if cargo and MANIFEST.exists() else ("cargo not found" if MANIFEST.exists() else f"{MANIFEST} not found")
    if why is None:
        assert cargo is not None
        profile = os.environ.get("SLUICE_NATIVE_PROFILE", "release")
        cmd = [cargo, "build", "--manifest-path", str(MANIFEST), "-p", "sluice-python-native", "--locked"]
        if profile == "release":
            cmd.append("--release")
        # pyo3 reads its build settings from the interpreter being built for.
        env = dict(os.environ, PYO3_PYTHON=sys.executable)
        print(f"sluice: building the native read path: {' '.join(cmd)}", file=sys.stderr)
        try:
            subprocess.run(cmd, check=True, env=env)
            meta = subprocess.run(
                [cargo, "metadata", "--manifest-path", str(MANIFEST), "--format-version", "1", "--no-deps"],
                check=True, capture_output=True, text=True, env=env,
            )  # fmt: skip
            target = Path(json.loads(meta.stdout)["target_directory"])
            lib = target / ("release" if profile == "release" else "debug") / "lib_native.so"
            dest = out_dir / "sluice" / "_native.abi3.so"
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(lib, dest)
            return
        except (OSError, subprocess.CalledProcessError, KeyError, ValueError) as e:
            why = f"the build failed: {e}"
    if mode == "required":
        raise SystemExit(f"sluice: SLUICE_NATIVE_BUILD=required, but the native read path was not built: {why}")
    print(f"sluice: WARNING: no native read path ({why}); installing the pure-Python client", file=sys.stderr)


class BinaryDistribution(Distribution):
    """Wheels carry a platform tag: the extension is built for this machine."""

    def has_ext_modules(self) -> bool:
        return os.environ.get("SLUICE_NATIVE_BUILD", "auto") != "0"


class BuildPyWithNative(build_py):
    def run(self) -> None:
        super().run()
        _build_native(Path(self.build_lib))


if sys.argv[1:] == ["--native-inplace"]:
    # `python3 setup.py --native-inplace`: into src/sluice, for a client run
    # from its source folder (PYTHONPATH=host-shim/python/src).
    _build_native(HERE / "src")
else:
    setup(cmdclass={"build_py": BuildPyWithNative}, distclass=BinaryDistribution)
