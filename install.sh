#!/bin/bash
# Installs Airlock on Debian 12: packages, build, the images, the libvirt daemons; then
# runs a command in a disposable VM to show it works and, on a terminal, starts the chat with
# the arguments given (./install.sh --local, ./install.sh --model gpt-4o ...). Run as root.
set -euo pipefail
cd "$(dirname "$0")"
packaging/debian-deps.sh
meson setup build --buildtype=release --prefix=/usr/local >/dev/null 2>&1 ||
  meson setup build --reconfigure --buildtype=release --prefix=/usr/local >/dev/null
ninja -C build >/dev/null
ninja -C build install >/dev/null
ldconfig
store=/var/lib/airlock/images
mkdir -p "$store"
rm -rf "$store/tiny.new"
cp -r build/images/tiny "$store/tiny.new"
rm -rf "$store/tiny"
mv "$store/tiny.new" "$store/tiny"
chmod -R a+rX /var/lib/airlock
# The main image. Its root disk takes a few minutes the first time (mmdebstrap from Debian's
# archive) and is cached in /var/cache/airlock; without it airlock still works with tiny.
airlock image build debian ||
  echo "airlock: the debian image could not be built; sessions use 'tiny'" >&2
echo "airlock: installed; running 'uname -a' in a disposable VM:" >&2
airlock exec -- uname -a
if [ -t 0 ] && [ -t 1 ]; then
  echo "airlock: starting a chat (airlock $*); Ctrl-D leaves" >&2
  exec airlock "$@"
fi
