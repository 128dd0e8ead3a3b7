"""The TypeScript client (clients/typescript) and its Playwright example
(examples/playwright-signup), run by their own runners against the real stack.

`scripts/install-node-deps.sh` installs them (`npm ci`, cached) and builds the
client; then Node's test runner runs the client's tests (which also run the
Playwright fixtures' own tests), and Playwright's runner the example in
Debian's Chromium. Each runner's whole output is shown when it fails.
"""

from __future__ import annotations

import io
import os
import re
import subprocess
import tarfile
from collections.abc import Mapping
from pathlib import Path

import pytest

from tests.servers import free_port
from tests.stack import ROOT, Stack

pytestmark = pytest.mark.integration

CLIENT = ROOT / "clients" / "typescript"
EXAMPLE = ROOT / "examples" / "playwright-signup"
CHROMIUM = "/usr/bin/chromium"


def run(
    args: list[str], cwd: Path, env: Mapping[str, str] | None = None, timeout: float = 300
) -> str:
    """Run `args`; its output, or a test failure showing all of it."""
    proc = subprocess.run(
        args,
        cwd=cwd,
        env={**os.environ, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
        check=False,
    )
    if proc.returncode != 0:
        pytest.fail(
            f"{' '.join(args)} exited with {proc.returncode}:\n{proc.stdout}", pytrace=False
        )
    return proc.stdout


@pytest.fixture(scope="module")
def node_deps() -> None:
    run(["bash", str(ROOT / "scripts" / "install-node-deps.sh")], ROOT, timeout=600)


def stack_env(stack: Stack) -> dict[str, str]:
    return {
        "SIGNALBOX_URL": stack.api_url,
        "SIGNALBOX_TOKEN": stack.token,
        "SIGNALBOX_SMTP_HOST": stack.smtp_host,
        "SIGNALBOX_SMTP_PORT": str(stack.smtp_port),
        "PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD": "1",
        "FORCE_COLOR": "0",
        "NO_COLOR": "1",
    }


@pytest.mark.timeout(600)
def test_the_node_client_tests_pass_against_the_stack(node_deps: None, stack: Stack) -> None:
    files = sorted(str(p.relative_to(CLIENT)) for p in (CLIENT / "test").glob("*.test.mjs"))
    assert len(files) >= 5, files
    out = run(
        ["node", "--test", "--test-concurrency=4", "--test-reporter=spec", *files],
        CLIENT,
        stack_env(stack),
    )
    passed = re.search(r"^\S*\s*pass (\d+)$", out, re.M)
    failed = re.search(r"^\S*\s*fail (\d+)$", out, re.M)
    assert passed and int(passed.group(1)) >= 25, out
    assert failed and failed.group(1) == "0", out


@pytest.mark.timeout(600)
def test_the_playwright_signup_example_passes_in_chromium(node_deps: None, stack: Stack) -> None:
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: run scripts/install-test-deps.sh")
    env = {**stack_env(stack), "SIGNUP_PORT": str(free_port()), "CI": "1"}
    out = run(["npx", "--no-install", "playwright", "test", "--reporter=list"], EXAMPLE, env)
    assert re.search(r"\b1 passed\b", out), out


def clean_copy(tmp_path: Path) -> Path:
    """The client as a clean checkout has it (no `dist`), its `node_modules`
    (what `npm ci` installs: the compiler) linked, not fetched again. `npm
    pack` runs `prepack`, which empties and rebuilds `dist`: in a copy, so the
    client's own build stays whole for the tests running beside this one."""
    import shutil

    clean = tmp_path / "checkout" / "typescript"
    shutil.copytree(
        CLIENT,
        clean,
        ignore=shutil.ignore_patterns(
            "dist", "node_modules", "*.tgz", "test-results", "playwright-report"
        ),
    )
    (clean / "node_modules").symlink_to(CLIENT / "node_modules", target_is_directory=True)
    return clean


def test_npm_pack_ships_the_build_and_a_readme_with_the_playwright_fixture(
    node_deps: None, tmp_path: Path
) -> None:
    packed = tmp_path / "packed"
    packed.mkdir()
    out = run(["npm", "pack", "--pack-destination", str(packed)], clean_copy(tmp_path))
    (tarball,) = packed.glob("signalbox-client-*.tgz")
    with tarfile.open(tarball) as tar:
        names = set(tar.getnames())
        readme_file = tar.extractfile("package/README.md")
        assert readme_file is not None, out
        readme = io.TextIOWrapper(readme_file, encoding="utf-8").read()
    for name in (
        "package/package.json",
        "package/dist/index.js",
        "package/dist/index.d.ts",
        "package/dist/playwright.js",
        "package/dist/playwright.d.ts",
    ):
        assert name in names, sorted(names)
    assert not [n for n in names if n.startswith(("package/src/", "package/test", "package/node"))]
    assert 'from "signalbox-client/playwright"' in readme
    assert "async ({ page, signalbox, mailbox })" in readme


def test_npm_pack_of_a_clean_copy_builds_dist_and_the_tarball_imports_in_a_fresh_project(
    node_deps: None, tmp_path: Path
) -> None:
    """A clean checkout has no `dist`: `npm pack` builds it (`prepack`), and a
    project that installs the tarball imports the client (no ERR_MODULE_NOT_FOUND)."""
    clean = clean_copy(tmp_path)
    assert not (clean / "dist").exists()
    packed = tmp_path / "packed"
    packed.mkdir()
    out = run(["npm", "pack", "--pack-destination", str(packed)], clean)
    (tarball,) = packed.glob("signalbox-client-*.tgz")
    with tarfile.open(tarball) as tar:
        names = set(tar.getnames())
    assert {"package/dist/index.js", "package/dist/playwright.js", "package/dist/message.js"} <= (
        names
    ), out

    app = tmp_path / "app"  # outside the checkout: nothing of the client's node_modules above it
    app.mkdir()
    (app / "package.json").write_text(
        '{"name": "app", "version": "1.0.0", "private": true, "type": "module"}'
    )
    run(["npm", "install", str(tarball), "--no-audit", "--no-fund", "--offline"], app)
    (app / "main.mjs").write_text(
        'import { Signalbox, Message, SignalCancelled } from "signalbox-client";\n'
        'const sb = new Signalbox({ url: "http://127.0.0.1:9", token: "t" });\n'
        "console.log(typeof sb.cancel, typeof Message.prototype.header,"
        " typeof Message.prototype.attachment, SignalCancelled.name);\n"
    )
    assert run(["node", "main.mjs"], app).split() == [
        "function",
        "function",
        "function",
        "SignalCancelled",
    ]
