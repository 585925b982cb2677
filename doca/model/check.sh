#!/usr/bin/env bash
# Checks the DOCA *test model* (see model.h; not NVIDIA DOCA):
#   1. builds it warning-free (-Werror) into a temporary folder;
#   2. for each library, the functions doca-sys declares in its
#      `doca_library!` block (bindings/doca-sys/src/<lib>.rs) are exactly the
#      doca_* functions the .so exports (nm -D --defined-only); besides them
#      only model_* helpers may be exported;
#   3. the dependent libraries need libdoca_common.so via $ORIGIN;
#   4. every declared symbol resolves when the libraries are opened the way
#      doca-sys opens them (dlopen RTLD_NOW|RTLD_LOCAL, doca_common first);
#   5. builds the driver (driver_*.c) against the libraries and runs its
#      scenarios.
# Exits non-zero on any failure. No cargo, nothing written outside a temp dir.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
rs_dir="$root/bindings/doca-sys/src"
cc=${CC:-cc}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/doca-model-check.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
lib="$tmp/lib"
fail=0

echo "== build (-Werror)"
MODEL_CFLAGS=-Werror "$here/build.sh" "$lib"

# The `fn doca_...(` names inside the doca_library! { ... } block of a .rs
# file (not the Rust helper methods in `impl` blocks after it).
declared() {
	awk '
		/doca_library!/ { inblk = 1; depth = 0; seen = 0 }
		inblk {
			line = $0
			opens = gsub(/\{/, "{", line)
			closes = gsub(/\}/, "}", line)
			print
			depth += opens - closes
			if (opens > 0) seen = 1
			if (seen && depth <= 0) inblk = 0
		}
	' "$1" | sed -nE 's/^[[:space:]]*fn (doca_[A-Za-z0-9_]+)\(.*/\1/p' | sort -u
}

echo "== exported symbols vs doca-sys declarations"
for name in common dma comch aes_gcm; do
	so="$lib/libdoca_$name.so"
	want=$(declared "$rs_dir/$name.rs")
	nwant=$(printf '%s\n' "$want" | grep -c . || true)
	if [ "$nwant" -eq 0 ]; then
		echo "FAIL libdoca_$name.so: no declarations parsed from $rs_dir/$name.rs"
		fail=1
		continue
	fi
	printf '%s\n' "$want" >"$tmp/want_$name"
	# "ADDR TYPE NAME" -> "NAME TYPE"
	nm -D --defined-only "$so" | awk 'NF == 3 { print $3, $2 }' | sort >"$tmp/nm_$name"
	have=$(awk '$1 ~ /^doca_/ { print $1 }' "$tmp/nm_$name" | sort -u)
	missing=$(comm -23 <(printf '%s\n' "$want") <(printf '%s\n' "$have"))
	extra=$(comm -13 <(printf '%s\n' "$want") <(printf '%s\n' "$have"))
	notfunc=$(awk '$1 ~ /^doca_/ && $2 != "T" { print $1 " (" $2 ")" }' "$tmp/nm_$name")
	others=$(awk '$1 !~ /^(doca_|model_)/ && $1 !~ /^(_init|_fini|_edata|_end|__bss_start)$/ { print $1 }' \
		"$tmp/nm_$name")
	helpers=$(awk '$1 ~ /^model_/ { print $1 }' "$tmp/nm_$name" | tr '\n' ' ')
	if [ -n "$missing$extra$notfunc$others" ]; then
		echo "FAIL libdoca_$name.so"
		[ -z "$missing" ] || echo "  missing: $(tr '\n' ' ' <<<"$missing")"
		[ -z "$extra" ] || echo "  exported but not declared by doca-sys: $(tr '\n' ' ' <<<"$extra")"
		[ -z "$notfunc" ] || echo "  not functions: $(tr '\n' ' ' <<<"$notfunc")"
		[ -z "$others" ] || echo "  unexpected exports: $(tr '\n' ' ' <<<"$others")"
		fail=1
	else
		echo "PASS libdoca_$name.so exports exactly the $nwant doca_* functions of $name.rs${helpers:+ (+ helpers: $helpers)}"
	fi
done

echo "== dependencies"
for name in dma comch aes_gcm; do
	dyn=$(readelf -d "$lib/libdoca_$name.so")
	# shellcheck disable=SC2016 # a literal $ORIGIN
	if grep -q 'NEEDED.*\[libdoca_common\.so\]' <<<"$dyn" && grep -q 'RUNPATH.*\[\$ORIGIN\]' <<<"$dyn"; then
		echo "PASS libdoca_$name.so needs libdoca_common.so (RUNPATH \$ORIGIN)"
	else
		echo "FAIL libdoca_$name.so lacks NEEDED libdoca_common.so or RUNPATH \$ORIGIN"
		fail=1
	fi
done
if readelf -d "$lib/libdoca_aes_gcm.so" | grep -q 'NEEDED.*\[libcrypto\.so'; then
	echo "PASS libdoca_aes_gcm.so needs libcrypto"
else
	echo "FAIL libdoca_aes_gcm.so does not need libcrypto"
	fail=1
fi

echo "== load like doca-sys (dlopen RTLD_NOW|RTLD_LOCAL, doca_common first)"
cat >"$tmp/load.c" <<'EOF'
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>
/* usage: load DIR name symfile [name symfile ...] */
int main(int argc, char **argv)
{
	int bad = 0;
	void *handles[8];
	int nh = 0;
	for (int i = 2; i + 1 < argc && nh < 8; i += 2) {
		char path[4096], sym[256];
		snprintf(path, sizeof(path), "%s/libdoca_%s.so", argv[1], argv[i]);
		void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
		if (h == NULL) {
			printf("FAIL dlopen %s: %s\n", path, dlerror());
			bad = 1;
			continue;
		}
		handles[nh++] = h;
		FILE *f = fopen(argv[i + 1], "r");
		int n = 0, missing = 0;
		while (f != NULL && fgets(sym, sizeof(sym), f) != NULL) {
			sym[strcspn(sym, "\n")] = 0;
			if (sym[0] == 0)
				continue;
			n++;
			if (dlsym(h, sym) == NULL) {
				printf("FAIL %s: %s does not resolve\n", argv[i], sym);
				missing = 1;
			}
		}
		if (f != NULL)
			fclose(f);
		printf("%s libdoca_%s.so: %d declared symbols resolve\n", missing || f == NULL ? "FAIL" : "PASS", argv[i], n);
		bad |= missing || f == NULL;
	}
	/* Reach into the model through the loaded handles: one call per library. */
	if (!bad && nh == 4) {
		const char *(*name)(unsigned) = (const char *(*)(unsigned))dlsym(handles[0], "doca_error_get_name");
		unsigned (*cap)(const void *) = (unsigned (*)(const void *))dlsym(handles[1], "doca_dma_cap_task_memcpy_is_supported");
		unsigned (*cc)(void *, const char *, void **) =
			(unsigned (*)(void *, const char *, void **))dlsym(handles[2], "doca_comch_client_create");
		unsigned (*aes)(const void *) = (unsigned (*)(const void *))dlsym(handles[3], "doca_aes_gcm_cap_task_encrypt_is_supported");
		void *out = NULL;
		int ok = strcmp(name(16), "DOCA_ERROR_NOT_FOUND") == 0 && cap(NULL) == 6 && cc(NULL, "x", &out) == 4 &&
			 aes(NULL) == 6;
		printf("%s calls through the dlopen'ed libraries\n", ok ? "PASS" : "FAIL");
		bad |= !ok;
	}
	return bad;
}
EOF
"$cc" -O1 -Wall -Wextra -Werror -o "$tmp/load" "$tmp/load.c" -ldl
if ! env -u LD_LIBRARY_PATH "$tmp/load" "$lib" common "$tmp/want_common" dma "$tmp/want_dma" \
	comch "$tmp/want_comch" aes_gcm "$tmp/want_aes_gcm"; then
	fail=1
fi

echo "== driver"
"$cc" -std=c11 -O1 -Wall -Wextra -Werror -o "$tmp/driver" "$here"/driver_*.c \
	-L "$lib" -ldoca_common -ldoca_dma -ldoca_comch -ldoca_aes_gcm -Wl,-rpath,"$lib" -lcrypto
if ! env -u SLUICE_DOCA_MODEL_DEVICES -u SLUICE_DOCA_MODEL_SAME_PROCESS_ONLY "$tmp/driver"; then
	fail=1
fi

if [ "$fail" -ne 0 ]; then
	echo "check.sh: FAIL"
	exit 1
fi
echo "check.sh: PASS"
