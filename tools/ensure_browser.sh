#!/usr/bin/env bash
# The headless browser of the page's test (tests/stack/test_page_browser.py): Debian's chromium and its
# chromedriver (one source package, so the two always match) and a font so screenshots are legible.
#
#   bash tools/ensure_browser.sh    install them from Debian packages when missing (root with apt-get);
#                                   exit 0 when both are there, else 1 with the reason on stderr
#
# Nothing is downloaded outside the distribution's packages: selenium is given /usr/bin/chromedriver,
# so its driver manager never fetches one.
set -euo pipefail
BROWSER=/usr/bin/chromium
DRIVER=/usr/bin/chromedriver
PACKAGES=(chromium chromium-driver fonts-liberation)

present() { [[ -x "$BROWSER" && -x "$DRIVER" ]]; }

if present; then exit 0; fi
if [[ "$(id -u)" != 0 ]]; then
  echo "browser: $BROWSER or $DRIVER missing and not root, so apt-get cannot install ${PACKAGES[*]}" >&2
  exit 1
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "browser: $BROWSER or $DRIVER missing and no apt-get to install ${PACKAGES[*]} with" >&2
  exit 1
fi
echo "browser: installing ${PACKAGES[*]} from Debian packages (a few minutes the first time)"
log="$(mktemp "${TMPDIR:-/tmp}/jev-browser-install.XXXXXX")"
# another apt run on the machine holds the dpkg lock for a while: wait for it rather than fail
if ! (apt-get -o DPkg::Lock::Timeout=600 update -qq &&
  DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends \
    "${PACKAGES[@]}") >"$log" 2>&1; then
  echo "browser: apt-get could not install ${PACKAGES[*]}; its last lines ($log):" >&2
  tail -n 5 "$log" >&2
  exit 1
fi
rm -f "$log"
if ! present; then
  echo "browser: installed ${PACKAGES[*]} but $BROWSER or $DRIVER is still missing" >&2
  exit 1
fi
echo "browser: $("$BROWSER" --version 2>/dev/null || echo chromium), $("$DRIVER" --version 2>/dev/null | head -c 60)"
