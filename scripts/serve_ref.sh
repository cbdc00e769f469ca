#!/bin/sh
# The official openai npm client, pinned, into build/npm (tests/serve_openai.js drives
# build/serve with it).
set -e
NPM_DIR=${NPM_DIR:-build/npm}
PKG=openai@4.95.0
command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1 || {
    echo "serve_ref: needs node and npm (scripts/deps.sh test installs them)" >&2
    exit 1
}
if ! grep -q '"version": "4.95.0"' "$NPM_DIR/node_modules/openai/package.json" 2>/dev/null; then
    mkdir -p "$NPM_DIR"
    echo "serve_ref: npm install $PKG into $NPM_DIR"
    npm install --silent --no-audit --no-fund --prefix "$NPM_DIR" $PKG
fi
