"""What the tests use beyond .venv is installed by the test command (scripts/setup_tests.sh, run by
scripts/test.sh), never by pytest (issue #35 item 5). Each step of the script runs here alone against stub
commands (`id`, `apt-get`, `npm`, ... recording their calls, on a PATH without the real ones), and the tests
themselves are checked to install nothing."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.helpers import REPO

SCRIPT = REPO / "scripts" / "setup_tests.sh"
# Real commands the script itself uses (the rest are stubs or absent).
TOOLS = ("sha256sum", "cut", "cat", "env", "dirname", "true", "mkdir", "ln")


def stubbed(tmp_path: Path, *, root: bool, have: tuple[str, ...] = ()) -> tuple[Path, Path]:
    """A PATH holding the real TOOLS, `id` answering as root or not, a recording `apt-get` and `npm`, and
    stand-ins for each command in `have` (as if installed). Returns (bin folder, call log)."""
    bin_dir, log = tmp_path / "bin", tmp_path / "calls.log"
    bin_dir.mkdir(parents=True)
    for tool in TOOLS:
        found = shutil.which(tool)
        assert found, tool
        (bin_dir / tool).symlink_to(found)

    def stub(name: str, body: str) -> None:
        (bin_dir / name).write_text(f"#!{shutil.which('bash')}\n{body}\n")
        (bin_dir / name).chmod(0o755)

    stub("id", f"echo {0 if root else 1000}")
    stub("apt-get", f'echo "apt-get $*" >> {log}')
    stub("npm", f'echo "npm $* in $PWD" >> {log}; mkdir -p node_modules')
    for name in have:
        stub(name, "exit 0")
    return bin_dir, log


def run(bin_dir: Path, steps: str, node_dir: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {"PATH": str(bin_dir), "HOME": os.environ.get("HOME", "/tmp")}
    if node_dir is not None:
        env["NODE_DIR"] = str(node_dir)
    return subprocess.run([shutil.which("bash") or "bash", "-c", f"source {SCRIPT}; {steps}"], env=env,
                          capture_output=True, text=True, timeout=60, check=False)


def calls(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


def test_redis_is_installed_with_apt_when_missing_and_left_alone_when_present(tmp_path: Path) -> None:
    bin_dir, log = stubbed(tmp_path, root=True)
    r = run(bin_dir, "install_redis")
    assert r.returncode == 0, r.stderr
    assert calls(log) == ["apt-get update -qq", "apt-get install -y -qq redis-server"]
    again, log2 = stubbed(tmp_path / "again", root=True, have=("valkey-server",))
    assert run(again, "install_redis").returncode == 0 and calls(log2) == []


@pytest.mark.parametrize("package", ["prometheus", "chromium"])
def test_prometheus_and_chromium_come_from_apt_when_missing(tmp_path: Path, package: str) -> None:
    bin_dir, log = stubbed(tmp_path, root=True)
    r = run(bin_dir, f"install_{package}")
    assert r.returncode == 0, r.stderr
    assert calls(log) == ["apt-get update -qq", f"apt-get install -y -qq --no-install-recommends {package}"]
    again, log2 = stubbed(tmp_path / "again", root=True, have=(package,))
    assert run(again, f"install_{package}").returncode == 0 and calls(log2) == []
    plain, log3 = stubbed(tmp_path / "plain", root=False)
    r = run(plain, f"install_{package}; echo finished")
    assert r.returncode == 0 and r.stdout.rstrip().endswith("finished") and calls(log3) == []
    assert f"{package} could not be installed" in r.stdout


def test_without_root_nothing_is_installed_and_the_run_goes_on_saying_why(tmp_path: Path) -> None:
    bin_dir, log = stubbed(tmp_path, root=False)
    r = run(bin_dir, "install_redis; install_node_clients; echo finished")
    assert r.returncode == 0 and r.stdout.rstrip().endswith("finished"), r.stderr
    assert calls(log) == []
    assert "redis-server could not be installed" in r.stdout and "npm client tests will skip" in r.stdout


def test_the_npm_clients_are_installed_as_locked_once_per_lock(tmp_path: Path) -> None:
    node_dir = tmp_path / "node"
    node_dir.mkdir()
    shutil.copy(REPO / "tests" / "e2e" / "node" / "package-lock.json", node_dir)
    bin_dir, log = stubbed(tmp_path, root=True, have=("node",))
    assert run(bin_dir, "install_node_clients", node_dir).returncode == 0
    assert calls(log) == [f"npm ci --no-audit --no-fund --loglevel=error in {node_dir}"]
    assert run(bin_dir, "install_node_clients", node_dir).returncode == 0
    assert len(calls(log)) == 1, "a second run with the same lock runs no npm"
    (node_dir / "package-lock.json").write_text((node_dir / "package-lock.json").read_text() + "\n")
    assert run(bin_dir, "install_node_clients", node_dir).returncode == 0
    assert len(calls(log)) == 2, "a changed lock is installed again"


def test_node_and_npm_come_from_apt_when_missing(tmp_path: Path) -> None:
    node_dir = tmp_path / "node"
    node_dir.mkdir()
    shutil.copy(REPO / "tests" / "e2e" / "node" / "package-lock.json", node_dir)
    bin_dir, log = stubbed(tmp_path, root=True)
    (bin_dir / "npm").rename(bin_dir / "npm-later")  # npm is missing until apt-get installs it
    apt = bin_dir / "apt-get"
    installs = f"ln -sf {bin_dir}/npm-later {bin_dir}/npm\nln -sf {bin_dir}/true {bin_dir}/node\n"
    apt.write_text(apt.read_text() + "\n" + installs)
    r = run(bin_dir, "install_node_clients", node_dir)
    assert r.returncode == 0, r.stderr
    assert calls(log)[:2] == ["apt-get update -qq", "apt-get install -y -qq nodejs npm"]
    assert calls(log)[-1].startswith("npm ci")


def test_the_test_command_runs_it_after_the_set_up() -> None:
    text = (REPO / "scripts" / "test.sh").read_text(encoding="utf-8")
    assert text.index("bash scripts/setup.sh") < text.index("bash scripts/setup_tests.sh") < text.index("-m pytest")


# What would install something from inside a test: a package manager run as a command.
_INSTALLS = re.compile(r"""apt-get\s+(update|install)|["']npm["'],\s*["'](ci|install)["']|\bnpm\s+(ci|install)\b"""
                       r"""|["']pip["'],\s*["']install["']|-m\s+pip\s+install""")


@pytest.mark.parametrize("path", sorted(p for p in (REPO / "tests").rglob("*.py") if p.name != Path(__file__).name),
                         ids=lambda p: str(p.relative_to(REPO)))
def test_no_test_installs_anything(path: Path) -> None:
    """Skip reasons and docstrings may name an install command; no test may run one (a subprocess call with
    a package manager's install in its arguments, or in a shell string)."""
    text = path.read_text(encoding="utf-8")
    for call in re.finditer(r"subprocess\.(run|Popen|call|check_call|check_output)\((.{0,400}?)\)", text, re.S):
        assert not _INSTALLS.search(call.group(2)), f"{path.name} installs from a test: {call.group(0)[:200]}"
