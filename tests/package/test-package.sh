#!/bin/bash
# The Debian packages, built, linted, installed into a scratch root, upgraded, removed and
# purged (TAP). Run as root (dpkg --root writes owners); this machine's own dpkg database, files
# and groups are never touched: the maintainer scripts run with DPKG_ROOT set to the scratch
# root (dpkg --force-script-chrootless), the way they would for a chrootless bootstrap.
#   test-package.sh SOURCE_ROOT VERSION
set -uo pipefail
src=$1
version=$2
tmp=$(mktemp -d "${TMPDIR:-/tmp}/airlock-package.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
n=0
failed=0
ok() { # ok DESCRIPTION COMMAND...: one TAP line; the command's output only when it fails
    local what=$1 log
    shift
    n=$((n + 1))
    if log=$("$@" 2>&1); then
        echo "ok $n - $what"
    else
        echo "not ok $n - $what"
        sed 's/^/# /' <<<"$log" | tail -30
        failed=$((failed + 1))
    fi
}
finish() {
    echo "1..$n"
    exit $((failed > 0))
}
if [ "$(id -u)" != 0 ]; then
    ok "runs as root (dpkg --root)" false
    finish
fi

# ---- build and lint ----
t0=$SECONDS
out=$tmp/out
ok "packaging/build-deb.sh builds the packages" \
    env DEB_BUILD_OPTIONS=noddebs AIRLOCK_DEB_JOBS=2 nice "$src/packaging/build-deb.sh" "$out"
echo "# built in $((SECONDS - t0)) s"
debs=("$out"/airlock_*.deb "$out"/airlock-guest_*.deb "$out"/libairlock-dev_*.deb
    "$out"/python3-airlock_*.deb)
ok "four packages: airlock, airlock-guest, libairlock-dev, python3-airlock" ls "${debs[@]}"
[ -e "${debs[0]}" ] || finish
ok "the package version is the project's ($version)" \
    bash -c "dpkg-deb -f '${debs[0]}' Version | grep -qx '$version\(-.*\)\?'"
lint() {
    lintian --fail-on error "$out"/*.changes >"$tmp/lintian" 2>&1
    local rc=$?
    cat "$tmp/lintian"
    ! grep -q '^E:' "$tmp/lintian" && [ $rc -eq 0 ]
}
ok "lintian reports no errors" lint
sed 's/^/# lintian: /' "$tmp/lintian"

# ---- a scratch root with an empty dpkg database and the base accounts ----
root=$tmp/root
mkdir -p "$root"/var/lib/dpkg/{info,updates,triggers} "$root/etc" "$root/var/log" "$root/var/cache" \
    "$root/run"
# systemd's own dirs, as a Debian root has them (package systemd): dh_installsystemd's scripts
# enable airlockd.socket there (a symlink, deb-systemd-helper's state) and purge removes that.
mkdir -p "$root/etc/systemd/system" "$root/var/lib/systemd"
touch "$root/var/lib/dpkg/status" "$root/var/lib/dpkg/available"
printf 'root:x:0:\n' >"$root/etc/group"
printf 'root:*::\n' >"$root/etc/gshadow"
printf 'root:x:0:0:root:/root:/bin/sh\n' >"$root/etc/passwd"
chmod 0640 "$root/etc/gshadow"
snapshot() { # every path but dpkg's own records and the backups groupadd keeps (etc/group-)
    (cd "$root" && find . -path ./var/lib/dpkg -prune -o -path './etc/*-' -prune -o \
        -printf '%y %m %p\n' | sort)
}
etc_before=$(cat "$root/etc/group" "$root/etc/gshadow")
snapshot >"$tmp/before"
dpkg_root() {
    dpkg --root="$root" --force-script-chrootless --force-depends --log=/dev/null "$@"
}
ok "dpkg installs the four packages into the scratch root" dpkg_root -i "${debs[@]}"

# ---- what landed ----
lib=$root/usr/lib/x86_64-linux-gnu
run() { LD_LIBRARY_PATH=$lib "$@"; }
files=(usr/bin/airlock usr/lib/x86_64-linux-gnu/libairlock.so.1
    usr/share/man/man1/airlock.1.gz usr/share/man/man5/airlock-profiles.5.gz
    usr/sbin/airlockd etc/airlock/airlockd.conf lib/systemd/system/airlockd.service
    lib/systemd/system/airlockd.socket usr/share/man/man8/airlockd.8.gz
    usr/share/man/man5/airlockd.conf.5.gz
    usr/share/bash-completion/completions/airlock usr/libexec/airlock/airlock-agent
    usr/share/airlock/images/build-tiny.sh usr/share/airlock/images/build-debian.sh
    usr/share/airlock/images/lib/boot.sh usr/share/airlock/guest-agent/kernels/python.py
    usr/include/airlock.h usr/include/airlock/text.h usr/include/airlock/policy.h
    usr/lib/x86_64-linux-gnu/pkgconfig/airlock.pc
    usr/lib/python3/dist-packages/airlock/__init__.py)
missing() { for f in "${files[@]}"; do [ -e "$root/$f" ] || echo "missing: $f"; done | grep . && return 1 || return 0; }
ok "the files land where they belong" missing
# The Python client where Debian's python3 looks (dist-packages), importable from that copy
# alone: no other airlock on the path, no site directories.
py_import() {
    local d=$root/usr/lib/python3/dist-packages
    /usr/bin/python3 -I -B -c "
import sys
sys.path = ['$d'] + [p for p in sys.path if 'packages' not in p]
import airlock
assert airlock.__file__.startswith('$d/'), airlock.__file__
assert callable(airlock.Sandbox) and issubclass(airlock.TimeoutException, Exception)
print(airlock.__file__)"
    /usr/bin/python3 -c "import sys; sys.exit('/usr/lib/python3/dist-packages' not in sys.path)"
    # what python3 leaves next to the module when root imports it goes with the package
    /usr/bin/python3 -I -c "import sys; sys.path.insert(0, '$d'); import airlock"
    [ -d "$d/airlock/__pycache__" ]
}
ok "python3-airlock: the module imports from dist-packages alone" py_import
ok "the installed airlock --version says $version" \
    bash -c "LD_LIBRARY_PATH='$lib' '$root/usr/bin/airlock' --version | grep -q '^airlock $version '"
ok "the installed airlock --help and exec --help work" \
    bash -c "LD_LIBRARY_PATH='$lib' '$root/usr/bin/airlock' --help | grep -q exec &&
             LD_LIBRARY_PATH='$lib' '$root/usr/bin/airlock' exec --help | grep -q -- --disk-budget"
ok "the installed agent is static and runs (--version)" \
    bash -c "'$root/usr/libexec/airlock/airlock-agent' --version && ! ldd '$root/usr/libexec/airlock/airlock-agent' 2>/dev/null | grep -q '=>'"
# The library looks for recipes and the agent at the paths it was built with: those must be the
# paths the packages put them at.
paths() {
    local p
    for p in /usr/share/airlock/images /usr/libexec/airlock/airlock-agent \
        /usr/share/airlock/guest-agent/kernels; do
        grep -qaF "$p" "$lib/libairlock.so.1" || { echo "libairlock does not name $p"; return 1; }
        [ -e "$root$p" ] || { echo "$p is not in the packages"; return 1; }
    done
}
ok "the recipe, agent and kernel paths built in are the installed ones" paths
render() {
    local page warn
    for page in "$root"/usr/share/man/man1/airlock.1.gz "$root"/usr/share/man/man5/airlock-profiles.5.gz \
        "$root"/usr/share/man/man8/airlockd.8.gz "$root"/usr/share/man/man5/airlockd.conf.5.gz; do
        warn=$(LC_ALL=C.UTF-8 MANWIDTH=80 man --warnings=w -l "$page" 2>&1 >"$tmp/page") || return 1
        [ -z "$warn" ] || { echo "$warn"; return 1; }
        grep -q '^NAME' "$tmp/page" || return 1
    done
}
ok "man -l renders the installed pages without warnings" render
# The units: systemd-analyze verify works without systemd as PID 1 (it loads the units offline);
# --root makes it find ExecStart's binary and the man pages in the scratch root. What it cannot
# check here is a real start (the sandboxing needs systemd as PID 1): the daemon is started by
# the unit's own command line instead, below.
verify_units() {
    # The scratch root has no systemd of its own (no sysinit.target, no libvirtd.service), so
    # the installed units are verified against this machine's unit set, from a copy whose
    # ExecStart names the scratch root's binary (verify checks that it is executable). The man
    # pages they name are checked by the render step above (--man=no: they are not on the
    # machine's man path).
    local u=$tmp/units
    mkdir -p "$u"
    cp "$root/lib/systemd/system/airlockd.socket" "$u/"
    sed "s|^ExecStart=/usr/sbin/airlockd |ExecStart=$root/usr/sbin/airlockd |" \
        "$root/lib/systemd/system/airlockd.service" >"$u/airlockd.service"
    grep -q "^ExecStart=$root/" "$u/airlockd.service" || { echo "no ExecStart to check"; return 1; }
    # verify exits 0 on a setting it ignores (a bad value, an unknown key): any word fails.
    local out
    out=$(SYSTEMD_LOG_LEVEL=notice systemd-analyze verify --man=no "$u/airlockd.socket" \
        "$u/airlockd.service" 2>&1)
    local rc=$?
    echo "$out"
    [ $rc -eq 0 ] && [ -z "$out" ]
}
ok "the units pass systemd-analyze verify" verify_units
ok "the service is hardened as documented" bash -c "
    u='$root/lib/systemd/system/airlockd.service'
    for k in ProtectSystem=strict NoNewPrivileges=yes PrivateTmp=yes 'ReadWritePaths=/var/lib/airlock /var/cache/airlock' \
        RuntimeDirectory=airlock Requires=libvirtd.service 'ExecStart=/usr/sbin/airlockd --config /etc/airlock/airlockd.conf'; do
        grep -qxF \"\$k\" \"\$u\" || { echo \"missing: \$k\"; exit 1; }
    done
    grep -qxF ListenStream=/run/airlock/airlockd.sock '$root/lib/systemd/system/airlockd.socket'"
# The daemon from the scratch root's files, in the foreground the way the unit starts it (its
# ExecStart, the installed config with the paths moved into a temp dir), answers /v1/health on
# a socket in that dir; then the same through socket activation (LISTEN_FDS), as systemd would.
# health_then_stop PID DIR SOCKET: waits for the daemon PID's SOCKET, asks /v1/health, stops it
# with SIGTERM; succeeds when it answered ok and exited cleanly (its log and answer shown).
health_then_stop() {
    local pid=$1 d=$2 sock=$3 i
    for i in $(seq 100); do [ -S "$sock" ] && break; sleep 0.1; done
    curl -sf --unix-socket "$sock" http://airlockd/v1/health >"$d/health"
    local rc=$?
    kill -TERM "$pid"
    wait "$pid" || rc=1
    cat "$d/log" "$d/health"
    [ $rc -eq 0 ] && grep -q '"status":"ok"' "$d/health"
}
daemon_runs() {
    local d=$tmp/daemon pid i
    mkdir -p -m 0700 "$d"
    sed -e "s|^socket = .*|socket = $d/airlockd.sock|" -e "s|^keys_db = .*|keys_db = $d/keys.db|" \
        -e "s|^spool_dir = .*|spool_dir = $d/spool|" \
        -e "s|^allow_group = airlock\$|allow_group = $(awk -F: '$1 == "airlock" {print $3}' "$root/etc/group")|" \
        "$root/etc/airlock/airlockd.conf" >"$d/conf"
    # (the group is the scratch root's: the daemon reads this machine's group database, so by gid)
    grep -q "^allow_group = [0-9][0-9]*$" "$d/conf" || { echo "allow_group not set by gid"; return 1; }
    grep -q "^socket = $d/" "$d/conf" || { echo "the installed config has no socket line"; return 1; }
    LD_LIBRARY_PATH=$lib "$root/usr/sbin/airlockd" --config "$d/conf" >/dev/null 2>"$d/log" &
    health_then_stop $! "$d" "$d/airlockd.sock" && [ ! -e "$d/airlockd.sock" ]
}
ok "the installed airlockd starts in the foreground and answers /v1/health" daemon_runs
activated() {
    local d=$tmp/activated pid i
    mkdir -p -m 0700 "$d"
    printf 'socket = %s\nkeys_db = %s\nspool_dir = %s\n' /nonexistent/unused.sock "$d/keys.db" \
        "$d/spool" >"$d/conf"
    LD_LIBRARY_PATH=$lib systemd-socket-activate -l "$d/act.sock" \
        "$root/usr/sbin/airlockd" --config "$d/conf" >/dev/null 2>"$d/log" &
    health_then_stop $! "$d" "$d/act.sock" && grep -q 'from systemd' "$d/log"
}
ok "the installed airlockd takes a socket-activated socket (LISTEN_FDS)" activated
ok "the installed completion loads and completes 'airlock ex'" bash --norc -c "
    source '$root/usr/share/bash-completion/completions/airlock'
    complete -p airlock | grep -q -- '-F _airlock' &&
    COMP_WORDS=(airlock ex) COMP_CWORD=1 && _airlock && [ \"\${COMPREPLY[*]}\" = exec ]"
# libairlock-dev: a program built with pkg-config against the scratch root (its prefix moved
# there; what it requires is this machine's), run against it.
cat >"$tmp/embed.c" <<'C'
#include <airlock.h>
#include <stdio.h>
int main(void)
{
    char dir[4096];
    al_error err = {0};
    if (al_image_store_dir(dir, sizeof(dir), &err) < 0)
        return 1;
    puts(dir);
    return 0;
}
C
embed() {
    local flags
    flags=$(PKG_CONFIG_PATH=$lib/pkgconfig pkg-config --define-variable=prefix="$root/usr" \
        --cflags --libs airlock) &&
        cc -o "$tmp/embed" "$tmp/embed.c" $flags &&
        [ "$(AIRLOCK_IMAGE_DIR=/nowhere/x LD_LIBRARY_PATH=$lib "$tmp/embed")" = /nowhere/x ]
}
ok "a program builds with pkg-config airlock and runs against libairlock" embed
# The installed recipes and agent build an image (tiny: no download, a few seconds).
build_tiny() {
    AIRLOCK_RECIPE_DIR=$root/usr/share/airlock/images \
        AIRLOCK_AGENT_BIN=$root/usr/libexec/airlock/airlock-agent \
        AIRLOCK_IMAGE_DIR=$tmp/store run "$root/usr/bin/airlock" image build tiny &&
        AIRLOCK_IMAGE_DIR=$tmp/store run "$root/usr/bin/airlock" image ls | grep -q '^tiny '
}
ok "the installed recipes and agent build the tiny image" build_tiny

# ---- the maintainer scripts ----
dirs() {
    local d
    for d in var/lib/airlock var/lib/airlock/images var/lib/airlock/state var/cache/airlock; do
        [ "$(stat -c '%a %U' "$root/$d")" = "755 root" ] || { echo "$d: $(stat -c '%a %U' "$root/$d" 2>&1)"; return 1; }
    done
}
ok "postinst made the image store, state and cache dirs (0755, root's)" dirs
ok "postinst enables airlockd.socket, not the service (started on first use)" bash -c "
    [ -L '$root/etc/systemd/system/sockets.target.wants/airlockd.socket' ] &&
    [ ! -e '$root/etc/systemd/system/multi-user.target.wants/airlockd.service' ]"
ok "postinst made the airlock group" grep -q '^airlock:x:[0-9]*:$' "$root/etc/group"
mkdir -p "$root/var/lib/airlock/images/mine" "$root/var/lib/airlock/state/airlock-s1"
echo '{}' >"$root/var/lib/airlock/images/mine/manifest.json"
echo data >"$root/var/lib/airlock/state/airlock-s1/disk.qcow2"
echo cached >"$root/var/cache/airlock/debian-0.qcow2"
gid=$(grep '^airlock:' "$root/etc/group")
kept() {
    [ -s "$root/var/lib/airlock/images/mine/manifest.json" ] &&
        [ -s "$root/var/lib/airlock/state/airlock-s1/disk.qcow2" ] &&
        [ -s "$root/var/cache/airlock/debian-0.qcow2" ] &&
        [ "$(grep '^airlock:' "$root/etc/group")" = "$gid" ]
}
ok "an upgrade (the packages installed again) succeeds" dpkg_root -i "${debs[@]}"
ok "an upgrade keeps images, sessions' state, the cache and the group" kept
ok "remove succeeds" dpkg_root -r python3-airlock libairlock-dev airlock-guest airlock
ok "remove keeps images, sessions' state, the cache and the group" kept
ok "purge succeeds" dpkg_root -P python3-airlock libairlock-dev airlock-guest airlock
snapshot >"$tmp/after"
ok "purge leaves no file behind" diff "$tmp/before" "$tmp/after"
ok "purge removes the airlock group" \
    bash -c "[ \"\$(cat '$root/etc/group' '$root/etc/gshadow')\" = '$etc_before' ]"
echo "# took $((SECONDS - t0)) s"
finish
