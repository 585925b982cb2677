#!/usr/bin/env bash
# Builds the DOCA *test model* (see model.h; not NVIDIA DOCA) into DIR as
#   libdoca_common.so   common_dev.c common_core.c common_mmap.c: the core
#                       model and its shared state
#   libdoca_dma.so      dma.c     -> libdoca_common.so
#   libdoca_comch.so    comch.c   -> libdoca_common.so
#   libdoca_aes_gcm.so  aes_gcm.c -> libdoca_common.so, libcrypto (OpenSSL 3)
# so that DOCA_LIB_DIR=DIR makes doca-sys load the model.
#
# Usage: doca/model/build.sh DIR
# Environment: CC (default cc), MODEL_CFLAGS (extra flags, e.g. -Werror).
set -euo pipefail

if [ $# -ne 1 ]; then
	echo "usage: $0 DIR" >&2
	exit 2
fi
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
common_src=("$here/common_dev.c" "$here/common_core.c" "$here/common_mmap.c")
mkdir -p "$1"
out=$(cd "$1" && pwd)
cc=${CC:-cc}
# shellcheck disable=SC2206 # MODEL_CFLAGS is a list of flags on purpose
cflags=(-std=c11 -shared -fPIC -Wall -Wextra -O1 -fvisibility=hidden ${MODEL_CFLAGS:-})
# Every part must resolve all its references at link time.
# shellcheck disable=SC2054 # commas belong to -Wl, options
ldflags=(-Wl,--no-undefined)
# The dependent libraries find libdoca_common.so next to themselves; doca-sys
# opens each library RTLD_LOCAL, so they must link it, not rely on globals.
# shellcheck disable=SC2054,SC2016 # -Wl, commas; $ORIGIN is for the linker
dep=(-L "$out" -Wl,--no-as-needed -ldoca_common -Wl,--as-needed '-Wl,-rpath,$ORIGIN')

"$cc" "${cflags[@]}" -Wl,-soname,libdoca_common.so "${ldflags[@]}" \
	-o "$out/libdoca_common.so" "${common_src[@]}"
"$cc" "${cflags[@]}" -Wl,-soname,libdoca_dma.so "${ldflags[@]}" \
	-o "$out/libdoca_dma.so" "$here/dma.c" "${dep[@]}"
"$cc" "${cflags[@]}" -Wl,-soname,libdoca_comch.so "${ldflags[@]}" \
	-o "$out/libdoca_comch.so" "$here/comch.c" "${dep[@]}"
"$cc" "${cflags[@]}" -Wl,-soname,libdoca_aes_gcm.so "${ldflags[@]}" \
	-o "$out/libdoca_aes_gcm.so" "$here/aes_gcm.c" "${dep[@]}" -lcrypto
echo "DOCA test model built in $out"
