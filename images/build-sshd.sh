#!/usr/bin/env bash
# Builds the `sshd` guest image: the `debian` image's disk plus openssh-server, sudo and a
# NoCloud first-boot step, and no airlock agent. The host boots it with a cloud-init NoCloud
# seed (an ISO 9660 disk labelled cidata: user key, pinned ed25519 host key), reaches it over
# SSH as `airlock` (passwordless sudo) and copies the agent over SFTP. See build-debian.sh
# (--variant=sshd) for the parts and images/sshd/airlock-boot for the boot step.
#
#   images/build-sshd.sh AGENT_BINARY OUTDIR [--toolchain]
#
# The agent still serves as the initramfs's /init (modules, root switch); it never reaches the
# root disk. The root disk is cached as CACHE/sshd-HASH.qcow2, like debian's.
set -euo pipefail
exec bash "$(dirname "$0")/build-debian.sh" --variant=sshd "$@"
