#!/usr/bin/env bash
# Debian's Chromium for the details page's browser tests (pytest marker `browser`; Playwright drives it, and never
# downloads a browser of its own). Nothing is done when /usr/bin/chromium is there; otherwise it is installed with
# apt-get, as root (CI) or through password-less sudo. Where neither is possible it says so and leaves the tests to
# skip with that reason (or to fail, under GATEKEEPER_REQUIRE_BROWSER, which .ci/run sets).
set -euo pipefail
chromium=${GATEKEEPER_CHROMIUM:-/usr/bin/chromium}  # where the tests look for it (tests/conftest.py)
[ -x "$chromium" ] && exit 0
why=""
sudo=""
if ! command -v apt-get >/dev/null; then
  why="no apt-get on this machine"
elif [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null && sudo -n true 2>/dev/null; then sudo=sudo; else why="not root, and no password-less sudo"; fi
fi
if [ -n "$why" ]; then
  echo "install-browser: $chromium is missing and cannot be installed here ($why): the browser tests will" \
       "skip; install Debian's chromium package to run them" >&2
  exit 0
fi
echo "install-browser: installing Debian's chromium for the browser tests" >&2
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq chromium >/dev/null
