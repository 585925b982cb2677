#!/usr/bin/env bash
# Builds the arm64 packages (sluice-agent for the BlueField-3 Arm cores, and
# sluice-shim for arm64 hosts) natively, with the same recipe CI runs on
# x86_64: scripts/package (cargo build --release, cargo deb, checks).
#
# Where to run it:
#   * on the BlueField itself (BF-Bundle Ubuntu 22.04/24.04; it has
#     build-essential; install Rust with rustup first), or on any arm64
#     machine running the DPU's Ubuntu release, so that the glibc the
#     binaries need is the one the DPU has:
#         deploy/build-arm64.sh
#   * in a container of that release on an arm64 Docker host (on an x86_64
#     host this works too once qemu-user-static is registered, as bfb-build
#     does, only much slower):
#         deploy/build-arm64.sh --container ubuntu:22.04
#     NVIDIA's DOCA devel image for the BF-Bundle's DOCA version
#     (nvcr.io/nvidia/doca/doca:<version>-devel, arm64) works as well.
#
# Sluice's development machines are x86_64 without an aarch64 Rust standard
# library, so this script has not run there; what CI proves is that the
# recipe builds and passes its checks on x86_64.
#
# Output: target/debian/sluice-{agent,shim}_<version>-1_arm64.deb
# (target/aarch64/debian/ with --container, to keep x86_64 artifacts apart).
set -euo pipefail
cd "$(dirname "$0")/.."

RUST_TOOLCHAIN=${RUST_TOOLCHAIN:-1.95.0}

if [ "${1:-}" = "--container" ]; then
  image=${2:?usage: $0 --container <image, e.g. ubuntu:22.04>}
  command -v docker >/dev/null 2>&1 || {
    echo "error: --container needs docker" >&2
    exit 1
  }
  # The container runs this script natively (arm64), as root, on the mounted
  # checkout; Rust comes from rustup inside it.
  exec docker run --rm --platform linux/arm64 -v "$PWD:/src" -w /src \
    -e CARGO_TARGET_DIR=/src/target/aarch64 -e RUST_TOOLCHAIN="$RUST_TOOLCHAIN" "$image" bash -euc '
      export DEBIAN_FRONTEND=noninteractive
      apt-get update -qq
      apt-get install -y -qq curl ca-certificates build-essential pkg-config >/dev/null
      curl -fsSL https://sh.rustup.rs | sh -s -- -y --profile minimal --default-toolchain "$RUST_TOOLCHAIN"
      . "$HOME/.cargo/env"
      deploy/build-arm64.sh'
fi

if [ "$(uname -m)" != aarch64 ]; then
  echo "error: deploy/build-arm64.sh builds natively and this is $(uname -m)." >&2
  echo "Run it on the BlueField or another arm64 machine, or with --container <image> on a Docker host." >&2
  echo "(On x86_64, scripts/package builds and checks the amd64 packages with the same recipe.)" >&2
  exit 1
fi

exec scripts/package "$@"
