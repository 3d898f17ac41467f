#!/bin/bash
# Installs Airlock on Debian 12 through its Debian packages: the build dependencies, the packages
# built from this tree (packaging/build-deb.sh, into build-deb/) installed with apt-get, the
# images, the libvirt daemons; then runs a command in a disposable VM to show it works and, on a
# terminal, starts the chat with the arguments given (./install.sh --local, ./install.sh --model
# gpt-4o ...). Run as root. Remove it with: apt-get purge airlock (images and all).
set -euo pipefail
cd "$(dirname "$0")"
packaging/debian-deps.sh
packaging/build-deb.sh build-deb >/dev/null
# An older install.sh installed into /usr/local, which comes first in PATH: remove that copy.
if [ -e /usr/local/bin/airlock ]; then
  # Its libairlock.so.1 would also be found before the package's (ld.so looks in /usr/local first).
  rm -rf /usr/local/bin/airlock /usr/local/lib/x86_64-linux-gnu/libairlock.so* \
    /usr/local/lib/x86_64-linux-gnu/pkgconfig/airlock.pc /usr/local/include/airlock.h \
    /usr/local/libexec/airlock /usr/local/share/airlock /usr/local/share/man/man1/airlock.1 \
    /usr/local/share/man/man5/airlock-profiles.5 /usr/local/share/bash-completion/completions/airlock
  ldconfig
fi
# --reinstall: a tree rebuilt without a new version is installed all the same.
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --reinstall \
  ./build-deb/airlock_*.deb ./build-deb/airlock-guest_*.deb ./build-deb/libairlock-dev_*.deb \
  ./build-deb/python3-airlock_*.deb \
  >/dev/null
airlock image build tiny
# The main image. Its root disk takes a few minutes the first time (mmdebstrap from Debian's
# archive) and is cached in /var/cache/airlock; without it airlock still works with tiny.
airlock image build debian ||
  echo "airlock: the debian image could not be built; sessions use 'tiny'" >&2
# Its warm template: a session's first plot then takes about a second, not a cold kernel's
# 15-20 s (a minute or two to build under emulation).
airlock image ls | grep -q '^debian ' && { airlock image warm debian ||
  echo "airlock: no warm template for debian; sessions boot cold ('airlock image warm debian')" >&2; }
echo "airlock: installed; running 'uname -a' in a disposable VM:" >&2
airlock exec -- uname -a
if [ -t 0 ] && [ -t 1 ]; then
  echo "airlock: starting a chat (airlock $*); Ctrl-D leaves" >&2
  exec airlock "$@"
fi
