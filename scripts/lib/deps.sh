# Shared helpers for scripts/: install what a fresh Debian machine lacks.
# Sourced, not executed.

# ensure_apt [--no-install-recommends] PKG...: installs the Debian packages
# that are not installed yet (as root, else with sudo).
ensure_apt() {
  local missing=() opts=()
  if [ "${1:-}" = --no-install-recommends ]; then opts+=("$1"); shift; fi
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "==> installing Debian packages: ${missing[*]}"
    local sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq ${opts[@]+"${opts[@]}"} "${missing[@]}" >/dev/null
  fi
}

# ensure_rust: Sluice needs a Rust toolchain (1.85 or newer) with cargo.
ensure_rust() {
  if ! command -v cargo >/dev/null 2>&1; then
    [ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"
  fi
  if ! command -v cargo >/dev/null 2>&1; then
    echo "error: cargo not found. Install Rust 1.85+ (https://rustup.rs) and re-run." >&2
    exit 1
  fi
}

# ensure_build_tools: a C compiler for ring and friends.
ensure_build_tools() {
  command -v cc >/dev/null 2>&1 || ensure_apt build-essential
  command -v curl >/dev/null 2>&1 || true
}

# disk_report LABEL: free space where the build and the tests write. A store
# that runs out of disk mid-test fails like any other 5xx, so CI logs this.
disk_report() {
  echo "==> disk ($1):"
  df -h --output=avail,size,target . /tmp /dev/shm 2>/dev/null | sed 's/^/    /' || true
  [ -d target ] && echo "    target/ uses $(du -sh target 2>/dev/null | cut -f1)"
  local avail_kib
  avail_kib=$(df -k --output=avail /tmp 2>/dev/null | tail -1 | tr -d ' ')
  if [ -n "$avail_kib" ] && [ "$avail_kib" -lt $((3 * 1024 * 1024)) ]; then
    echo "warning: less than 3 GiB free in /tmp; the integration tests write objects up to 256 MiB there" >&2
  fi
}
