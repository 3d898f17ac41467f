#!/usr/bin/env bash
# Builds the `desktop` guest image: the `debian` image's disk plus an X desktop (Xorg on the
# VGA, openbox, xterm, chromium, fonts), booted with Debian's generic kernel, whose bochs DRM
# driver sets the VGA's mode. The host takes the screen and drives a virtio tablet and keyboard
# itself (orchestrator/session/screen.c); nothing in the guest is trusted for that. See
# build-debian.sh (--variant=desktop) and images/desktop/airlock-desktop.
#
#   images/build-desktop.sh AGENT_BINARY OUTDIR [--toolchain]
#
# The root disk is cached as CACHE/desktop-HASH.qcow2, like debian's.
set -euo pipefail
exec bash "$(dirname "$0")/build-debian.sh" --variant=desktop "$@"
