#!/usr/bin/env bash
# mmdebstrap customize hook of the `sshd` image (images/debian/rootfs.sh --hook), run on the
# host after the `debian` image's own setup:
#
#   images/sshd/customize.sh ROOT
#
# The default user `airlock` (locked password, passwordless sudo), the sshd configuration, the
# first-boot step, and no host keys: each boot gets its own from the NoCloud seed.
set -euo pipefail
r=$1
here=$(cd "$(dirname "$0")" && pwd)

chroot "$r" useradd --create-home --shell /bin/bash --user-group airlock
# useradd leaves the password field "!": locked. sshd still takes keys (UsePAM yes, Debian's
# default, leaves the check to PAM's account stack, which only looks at expiry).
printf 'airlock ALL=(ALL) NOPASSWD:ALL\n' >"$r/etc/sudoers.d/airlock"
chmod 0440 "$r/etc/sudoers.d/airlock"
chroot "$r" visudo -cq -f /etc/sudoers.d/airlock

install -m 0644 "$here/sshd_config" "$r/etc/ssh/sshd_config.d/airlock.conf"
# openssh-server's postinst made host keys: the same in every session, and not the pinned one.
rm -f "$r"/etc/ssh/ssh_host_*
# pam_motd runs /etc/update-motd.d/* (a fork and exec per script, slow under emulation) for
# every session, `ssh host command` too; nobody reads a message of the day here.
sed -i -e 's/^\(session[[:space:]]\+optional[[:space:]]\+pam_motd\.so\)/# \1/' \
    "$r/etc/pam.d/sshd"
# The mount point of /usr/lib/airlock in the debian image: this image has no agent.
rmdir "$r/usr/lib/airlock"

install -m 0755 "$here/airlock-boot" "$r/usr/local/sbin/airlock-boot"
chroot "$r" python3 -c 'import yaml' # airlock-boot needs it
rm -rf "$r"/var/log/* "$r"/var/cache/debconf/*-old "$r"/var/lib/dpkg/*-old
