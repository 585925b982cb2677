#!/usr/bin/env bash
# Builds a BlueField boot image (BFB) that carries the Sluice agent, with
# NVIDIA's bfb-build (https://github.com/Mellanox/bfb-build) at a pinned tag.
#
# The image is NVIDIA's stock Ubuntu BlueField OS plus one extra file,
# /opt/sluice/sluice-agent_<version>_arm64.deb; bf.cfg's bfb_modify_os()
# installs, configures and enables it when the BFB is flashed:
#
#   deploy/bfb/build-bfb.sh target/debian/sluice-agent_0.1.0-1_arm64.deb
#   bfb-install --bfb target/bfb/<name>.bfb --config deploy/bfb/bf.cfg --rshim rshim0
#
# Inputs:
#   $1                     the arm64 agent package (deploy/build-arm64.sh)
#   BFB_DISTRO_VERSION     Ubuntu release of the image: 22.04 (default) or 24.04
#   IMAGE_TYPE             prod (default; production cards) or dev (engineering samples)
#   BFB_BUILD_DIR          scratch checkout of bfb-build (default target/bfb-build)
#   BFB_OUT_DIR            where the .bfb is copied (default target/bfb)
#
# Needs: docker, git, wget, root (bfb-build registers qemu-user-static on
# x86_64 hosts), ~30 GB of disk, and access to github.com, NVIDIA's package
# repositories (linux.mellanox.com) and cloud-images.ubuntu.com. None of that
# exists on Sluice's development machines: this script has not been run there;
# it refuses early, with the reason, when something is missing.
set -euo pipefail
cd "$(dirname "$0")/../.."

# bfb-build tags are per bundle and distribution; each pins the DOCA, BSP and
# kernel versions of the image (DOCA 3.4.0, BSP 4.15.0-13977 for these).
BFB_BUILD_REPO=https://github.com/Mellanox/bfb-build
BFB_DISTRO=ubuntu
BFB_DISTRO_VERSION=${BFB_DISTRO_VERSION:-22.04}
case "$BFB_DISTRO_VERSION" in
  22.04)
    BFB_BUILD_TAG=bf-bundle-3.4.0-92_26.04-ubuntu22.04
    BFB_BUILD_COMMIT=7d1852b1fdb257e046c7ab67c6a1f74478b07213
    ;;
  24.04)
    BFB_BUILD_TAG=bf-bundle-3.4.0-92_26.04-ubuntu24.04
    BFB_BUILD_COMMIT=2f3ca615a68c3ae208ffd1d93c545843db10c1e6
    ;;
  *)
    echo "error: BFB_DISTRO_VERSION must be 22.04 or 24.04 (got $BFB_DISTRO_VERSION)" >&2
    exit 2
    ;;
esac
IMAGE_TYPE=${IMAGE_TYPE:-prod}
BFB_BUILD_DIR=${BFB_BUILD_DIR:-target/bfb-build}
BFB_OUT_DIR=${BFB_OUT_DIR:-target/bfb}

die() {
  echo "error: $*" >&2
  exit 1
}

deb=${1:-}
[ -n "$deb" ] || die "usage: $0 <sluice-agent_<version>_arm64.deb>  (build it with deploy/build-arm64.sh)"
[ -f "$deb" ] || die "$deb: no such file (build it with deploy/build-arm64.sh on an arm64 machine)"
command -v dpkg-deb >/dev/null 2>&1 || die "dpkg-deb is required to check $deb"
[ "$(dpkg-deb --field "$deb" Package)" = sluice-agent ] || die "$deb is not the sluice-agent package"
arch=$(dpkg-deb --field "$deb" Architecture)
[ "$arch" = arm64 ] || die "$deb is for $arch; the BlueField Arm cores need arm64 (deploy/build-arm64.sh)"
case "$IMAGE_TYPE" in prod | dev) ;; *) die "IMAGE_TYPE must be prod or dev (got $IMAGE_TYPE)" ;; esac

missing=()
for tool in docker git wget; do
  command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
done
[ ${#missing[@]} -eq 0 ] || die "bfb-build needs ${missing[*]} (not installed here)"
docker info >/dev/null 2>&1 || die "docker is installed but its daemon is not reachable (is it running? are you root?)"
[ "$(id -u)" -eq 0 ] || die "run as root: bfb-build writes /etc/binfmt.d and runs privileged containers"

echo "==> bfb-build $BFB_BUILD_TAG ($BFB_BUILD_COMMIT) in $BFB_BUILD_DIR"
rm -rf "$BFB_BUILD_DIR"
git clone --quiet --depth 1 --branch "$BFB_BUILD_TAG" "$BFB_BUILD_REPO" "$BFB_BUILD_DIR"
head=$(git -C "$BFB_BUILD_DIR" rev-parse HEAD)
[ "$head" = "$BFB_BUILD_COMMIT" ] || die "tag $BFB_BUILD_TAG is now $head, expected $BFB_BUILD_COMMIT: review the change, then update the pin"

distro_dir="$BFB_BUILD_DIR/$BFB_DISTRO/$BFB_DISTRO_VERSION"
if [ ! -f "$distro_dir/Dockerfile" ] || [ ! -x "$distro_dir/bfb-build" ]; then
  die "$distro_dir lacks Dockerfile or bfb-build"
fi

# Stage the package: into the docker build context (bfb-build copies a fixed
# list of files, so add ours to it), then into the image at /opt/sluice/.
mkdir -p "$distro_dir/sluice"
cp "$deb" "$distro_dir/sluice/"
grep -q '^echo "deb \[trusted=yes\]' "$distro_dir/bfb-build" ||
  die "bfb-build at $BFB_BUILD_TAG changed shape (no 'echo \"deb [trusted=yes]' line): update the patch in $0"
# shellcheck disable=SC2016 # $WDIR is bfb-build's variable, expanded there.
patch_line='cp -a sluice $WDIR/'
sed -i "/^echo \"deb \\[trusted=yes\\]/i $patch_line" "$distro_dir/bfb-build"
grep -qxF "$patch_line" "$distro_dir/bfb-build" || die "could not patch $distro_dir/bfb-build"
printf '\n# Sluice: the agent package, installed by bf.cfg (bfb_modify_os) at flash time.\nADD sluice/ /opt/sluice/\n' \
  >>"$distro_dir/Dockerfile"

echo "==> IMAGE_TYPE=$IMAGE_TYPE ./bfb-build $BFB_DISTRO $BFB_DISTRO_VERSION (this takes a long while)"
log=$(mktemp)
(cd "$BFB_BUILD_DIR" && IMAGE_TYPE="$IMAGE_TYPE" ./bfb-build "$BFB_DISTRO" "$BFB_DISTRO_VERSION") 2>&1 | tee "$log"
bfb=$(grep -E '^/.*\.bfb$' "$log" | tail -n 1 || true)
rm -f "$log"
if [ -z "$bfb" ] || [ ! -f "$bfb" ]; then
  die "bfb-build finished without printing a .bfb path"
fi
mkdir -p "$BFB_OUT_DIR"
cp "$bfb" "$BFB_OUT_DIR/"
echo "BFB: $BFB_OUT_DIR/$(basename "$bfb")"
echo "flash: bfb-install --bfb $BFB_OUT_DIR/$(basename "$bfb") --config deploy/bfb/bf.cfg --rshim rshim0"
