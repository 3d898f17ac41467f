#!/bin/bash
# Installs what Airlock needs on Debian 12 (only what is missing) and starts virtlogd and
# libvirtd when they are not running (they may have no systemd to start them).
set -euo pipefail

PACKAGES=(
  # build
  gcc meson ninja-build pkg-config
  # host libraries
  libvirt-dev libcurl4-openssl-dev libcjson-dev libssh2-1-dev libarchive-dev libedit-dev libyaml-dev
  libpng-dev
  # airlockd: its HTTP server (with GnuTLS) and its key store
  libmicrohttpd-dev libsqlite3-dev
  # airlockd: the head of a guest service's answer to a WebSocket upgrade (ports.c)
  libhttp-parser-dev
  # airlockd: WebSocket frames of Open Interpreter's server protocol (oi.c)
  libwslay-dev
  # hypervisor
  libvirt-daemon-system libvirt-daemon-driver-qemu libvirt-clients qemu-system-x86 qemu-utils
  # the tiny image
  busybox-static linux-image-cloud-amd64 cpio
  # the desktop image: Debian's generic kernel (its bochs DRM driver sets the VGA's mode)
  linux-image-amd64
  # the debian image (root disk from the archive, ext4 without loop mounts, qcow2) and the
  # libvirt capabilities parser (the user QEMU runs as owns each session's disk overlay)
  mmdebstrap e2fsprogs libxml2-dev
  # the SSH transport: session keys (ssh-keygen), the cloud-init seed ISO, ss in its tests
  openssh-client genisoimage iproute2 libssl-dev
  # network on request (--net allow=...): each session's proxy (run by airlock, not the
  # package's service); openssl makes the network test's certificate authority
  squid openssl
  # images from Containerfiles and OCI or docker archives (airlock image build --from): buildah
  # builds (runc where cgroups are not v2 alone), podman holds the exported base, skopeo and
  # debugfs (e2fsprogs) for tests and commits
  buildah podman skopeo runc uidmap
  # a prompt zombie reaper for libvirtd where PID 1 is not an init (containers, sandboxes)
  tini
  # tests: sanitizers and libFuzzer runtimes, python for the integration tests, the format check
  clang libclang-rt-14-dev python3 clang-format
  # tests of the agent's language kernels on this machine (python with matplotlib, bash, node)
  python3-matplotlib python3-ipython bash nodejs
  # the check of docs/openapi.yaml against airlockd's routes; the MCP tools' JSON Schemas
  python3-yaml python3-jsonschema
  # a WebSocket client of the tests' own (Open Interpreter's server protocol on airlockd)
  python3-websockets
  # airlockd's web page tested in a real browser (headless Chromium driven by Selenium)
  chromium chromium-driver python3-selenium
  # libairlock's ABI against its baseline (abidw, abidiff)
  abigail-tools
  # man pages (scdoc) and the docs tests that render them (man, groff); bash completion's
  # directory (its pkg-config file)
  scdoc man-db groff-base bash-completion
  # the Debian package (packaging/debian) and its test; systemd: its pkg-config file (where the
  # units go), systemd-analyze verify and systemd-socket-activate (work without systemd as PID 1)
  debhelper dpkg-dev lintian fakeroot systemd curl
)

# the web page's terminal: xterm.js fetched with npm at build time (daemon/web/xterm.py); a
# machine's own Node (with its npm) stands, Debian's npm otherwise
command -v npm >/dev/null || PACKAGES+=(npm)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "airlock: installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# Daemons: systemd starts them where it runs; otherwise start them by hand.
mkdir -p /var/log/libvirt /var/run/libvirt
if ! virsh -c qemu:///system version >/dev/null 2>&1; then
  if [ -d /run/systemd/system ]; then
    systemctl start virtlogd libvirtd
  else
    pgrep -x virtlogd >/dev/null || virtlogd -d
    # QEMU processes are orphaned to the nearest subreaper when libvirt daemonizes them. Where
    # PID 1 reaps slowly, libvirt's destroy waits for the zombie (about 1 s per VM, measured);
    # tini as subreaper reaps at once, as systemd would.
    if ! pgrep -x libvirtd >/dev/null; then
      setsid tini -s -- libvirtd </dev/null >>/var/log/libvirt/libvirtd-stdout.log 2>&1 &
    fi
  fi
  for _ in $(seq 50); do
    virsh -c qemu:///system version >/dev/null 2>&1 && break
    sleep 0.2
  done
  virsh -c qemu:///system version >/dev/null
fi
