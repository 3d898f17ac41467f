#!/usr/bin/env bash
# mmdebstrap customize hook of the `desktop` image (images/debian/rootfs.sh --hook), run on the
# host after the `debian` image's own setup:
#
#   images/desktop/customize.sh ROOT
#
# The desktop's start program (airlock-desktop, named by airlock.service= on the kernel command
# line), the X server's fixed configuration, openbox's and chromium's settings for the account
# that runs the desktop (`user`, uid 1000, made by the debian image).
set -euo pipefail
r=$1
here=$(cd "$(dirname "$0")" && pwd)

install -m 0755 "$here/airlock-desktop" "$r/usr/local/sbin/airlock-desktop"
install -m 0755 "$here/as-user" "$r/usr/local/bin/as-user"
install -m 0755 "$here/airlock-desktop-warm" "$r/usr/local/sbin/airlock-desktop-warm"
install -d -m 0755 "$r/etc/X11/xorg.conf.d"
install -m 0644 "$here/xorg.conf" "$r/etc/X11/xorg.conf.d/10-airlock.conf"
# The account's groups for the X clients it runs; Xorg itself runs as root (no logind in the
# guest to hand an unprivileged server its devices), the desktop's programs as `user`.
chroot "$r" usermod -a -G video,audio user
# Chromium: no first-run dialogs, no keyring prompts, no crash reporter (nothing reaches out).
install -d -m 0755 "$r/etc/chromium/policies/managed"
cat >"$r/etc/chromium/policies/managed/airlock.json" <<'J'
{"DefaultBrowserSettingEnabled": false, "MetricsReportingEnabled": false,
 "PromotionalTabsEnabled": false, "BrowserSignin": 0, "PasswordManagerEnabled": false}
J
install -d -m 0755 "$r/etc/chromium.d"
printf 'export CHROMIUM_FLAGS="$CHROMIUM_FLAGS --no-first-run --password-store=basic --disable-gpu --no-default-browser-check"\n' \
    >"$r/etc/chromium.d/airlock"
# fontconfig's cache, built once here rather than by the first program of every session.
chroot "$r" fc-cache -s >/dev/null
rm -rf "$r"/var/log/* "$r"/var/cache/debconf/*-old "$r"/var/lib/dpkg/*-old
