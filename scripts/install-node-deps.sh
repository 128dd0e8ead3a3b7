#!/usr/bin/env bash
# Install and build the TypeScript client (clients/typescript) and the
# Playwright example (examples/playwright-signup) from their lock files:
#   - `npm ci` in each, from the npm registry; skipped while node_modules was
#     installed from the same lock file (and, for the example, the same build
#     of the client, which it copies in: see its .npmrc);
#   - `npm run build` (tsc) of the client.
# Playwright's own browser download is never used (PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD):
# the tests launch Debian's Chromium by path. Needs Node.js 20 or later.
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
client="${repo_root}/clients/typescript"
example="${repo_root}/examples/playwright-signup"
export PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1

say() { printf 'install-node-deps: %s\n' "$*"; }

if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
    say "node and npm are missing: run scripts/install-test-deps.sh" >&2
    exit 1
fi
major="$(node -p 'process.versions.node.split(".")[0]')"
if [ "${major}" -lt 20 ]; then
    say "Node.js $(node --version) is too old: signalbox-client needs Node.js 20 or later" >&2
    exit 1
fi

# `npm ci` in $1 unless its node_modules came from the same inputs ($2: their digest).
npm_ci_cached() {
    local dir="$1" digest="$2" stamp="$1/node_modules/.signalbox-installed"
    if [ -f "${stamp}" ] && [ "$(cat "${stamp}")" = "${digest}" ]; then
        say "$(basename "${dir}"): node_modules up to date"
        return
    fi
    say "$(basename "${dir}"): npm ci"
    (cd "${dir}" && npm ci --no-audit --no-fund --loglevel=error)
    printf '%s' "${digest}" >"${stamp}"
}

# One install at a time: parallel test workers (pytest-xdist) run this script
# from more than one test module, and a build empties dist/ while another
# test may be importing from it.
mkdir -p "${repo_root}/.signalbox"
exec 9>"${repo_root}/.signalbox/install-node-deps.lock"
flock 9

npm_ci_cached "${client}" "$(sha256sum "${client}/package-lock.json" | cut -d' ' -f1)"

# Build unless dist/ was built from these very sources (the digest of every
# input, kept beside node_modules' own stamp): a run that changes nothing
# leaves dist/ in place for whoever is reading it.
build_stamp="${client}/node_modules/.signalbox-built"
build_digest="$(cd "${client}" && find src package.json package-lock.json tsconfig*.json -type f -print0 \
    | sort -z | xargs -0 sha256sum | sha256sum | cut -d' ' -f1)"
if [ -f "${build_stamp}" ] && [ -d "${client}/dist" ] && [ "$(cat "${build_stamp}")" = "${build_digest}" ]; then
    say "clients/typescript: dist up to date"
else
    say "clients/typescript: npm run build"
    (cd "${client}" && rm -rf dist && npm run --silent build)
    printf '%s' "${build_digest}" >"${build_stamp}"
fi

# The example copies the client in: reinstall when the client's build changed.
client_digest="$(cd "${client}" && cat package.json README.md dist/* | sha256sum | cut -d' ' -f1)"
npm_ci_cached "${example}" "$(sha256sum "${example}/package-lock.json" | cut -d' ' -f1)-${client_digest}"
say "done"
