"""A plain, non-editable `pip install` of the wheel works outside the repository: the Hydra
configs ship inside the package, and the console script finds them with no SPLITSERVE_CONF.

The wheel is built from a copy of the files a source distribution holds, installed with
--no-deps into a new venv in a temporary directory; that venv sees the dependencies of the
running one through a path entry (not a site dir, so the editable install's hook there does not
run and `import splitserve` can only find the wheel's copy)."""

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "splitserve" / "conf"


def _run(args, **kw):
    proc = subprocess.run(args, capture_output=True, text=True, check=False, **kw)
    if proc.returncode != 0:
        raise AssertionError(f"{' '.join(map(str, args))} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n"
                             f"{proc.stderr[-3000:]}")
    return proc


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "splitserve", src / "splitserve", ignore=shutil.ignore_patterns("__pycache__"))
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp / "dist"),
          str(src)])
    (wheel,) = (tmp / "dist").glob("splitserve-*.whl")

    venv = tmp / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    py = venv / "bin" / "python"
    _run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "-q", str(wheel)])
    site = Path(_run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip())
    deps = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (site / "outer_deps.pth").write_text("".join(f"{d}\n" for d in sorted(deps)))
    env = {k: v for k, v in os.environ.items() if k not in ("SPLITSERVE_CONF", "PYTHONPATH")}
    work = tmp / "elsewhere"
    work.mkdir()
    return wheel, venv, site, env, work


def test_wheel_carries_every_config_file(installed):
    wheel = installed[0]
    names = set(zipfile.ZipFile(wheel).namelist())
    want = {f"splitserve/conf/{p.relative_to(CONF)}" for p in CONF.rglob("*.yaml")}
    assert len(want) > 20 and want <= names, sorted(want - names)


def test_installed_package_is_the_wheel_and_finds_its_conf(installed):
    _, venv, site, env, work = installed
    out = _run([str(venv / "bin" / "python"), "-c",
                "import splitserve, splitserve.cli as c; print(splitserve.__file__); print(c.conf_dir())"],
               cwd=work, env=env).stdout.split()
    assert Path(out[0]).is_relative_to(site) and Path(out[1]) == site / "splitserve" / "conf"


def test_console_script_help_and_train_config(installed):
    _, venv, _, env, work = installed
    script = venv / "bin" / "splitserve"
    assert "splitserve train" in _run([str(script), "--help"], cwd=work, env=env).stdout
    job = _run([str(script), "train", "--cfg", "job", "draft=dspark_b16", "loss=prefix"], cwd=work, env=env).stdout
    # The composed job: the chosen groups' values, over the dataclass defaults.
    assert "block_size: 16" in job and "kind: prefix" in job and "path: smollm2-135m" in job, job
