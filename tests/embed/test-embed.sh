#!/bin/bash
# An embedder's view of libairlock (issue 36): the build's library, header and airlock.pc
# installed into a scratch root (meson install --destdir), a program built against them
# through pkg-config alone with -std=c11 -Wall -Wextra -Werror (tests/embed/embed.c), run
# against a real session; and the header on its own compiled as C++.
#   test-embed.sh BUILD_DIR SOURCE_DIR IMAGE
set -euo pipefail
build=$1 src=$2 image=$3
tmp=$(mktemp -d "${TMPDIR:-/tmp}/airlock-embed.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
meson install -C "$build" --no-rebuild --quiet --destdir "$tmp/root" >/dev/null
pc=$(dirname "$(find "$tmp/root" -name airlock.pc | head -1)")
[ -n "$pc" ] || { echo "test-embed: no airlock.pc was installed"; exit 1; }
flags=$(PKG_CONFIG_LIBDIR=$pc PKG_CONFIG_SYSROOT_DIR=$tmp/root pkg-config --cflags --libs airlock)
# --variable prints it with the sysroot in front
libdir=$(PKG_CONFIG_LIBDIR=$pc PKG_CONFIG_SYSROOT_DIR=$tmp/root pkg-config --variable=libdir airlock)
cc -std=c11 -D_POSIX_C_SOURCE=200809L -Wall -Wextra -Werror -o "$tmp/embed" "$src/tests/embed/embed.c" $flags
echo "built against $(ls "$libdir"/libairlock.so.*.*) with: $flags"
# The headers alone, as C++ (their extern "C" blocks): nothing they declare is C-only.
printf '#include <airlock.h>\n#include <airlock/text.h>\n#include <airlock/policy.h>\nint main() { return al_version(nullptr) ? 0 : 1; }\n' >"$tmp/cxx.cc"
g++ -std=c++17 -Wall -Wextra -Werror -fsyntax-only $(PKG_CONFIG_LIBDIR=$pc PKG_CONFIG_SYSROOT_DIR=$tmp/root pkg-config --cflags airlock) "$tmp/cxx.cc"
echo "ok the headers compile as C++17"
# The installed library, not the build tree's (ldd says which was loaded). Read whole first:
# grep -q leaving early would make ldd's write fail and, under pipefail, the check with it.
loaded=$(LD_LIBRARY_PATH=$libdir ldd "$tmp/embed")
grep -q "$tmp/root.*libairlock.so.1" <<<"$loaded" ||
    { echo "test-embed: the program does not load the installed libairlock.so.1:"; echo "$loaded"; exit 1; }
LD_LIBRARY_PATH=$libdir "$tmp/embed" "$image"
