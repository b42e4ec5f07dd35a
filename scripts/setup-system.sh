#!/usr/bin/env bash
# System setup for ckpt-trace, idempotent: Debian packages (as root), kernel headers
# for bcc, tracefs. Without root it only reports what is missing; recording then
# falls back to the strace backend.
set -uo pipefail

PACKAGES=(strace fio gcc linux-libc-dev python3-venv python3-dev python3-bpfcc linux-headers-amd64 chromium e2fsprogs)

say() { echo "setup-system: $*"; }

missing_packages() {
    local missing=()
    for pkg in "${PACKAGES[@]}"; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
    done
    echo "${missing[@]:-}"
}

install_packages() {
    command -v apt-get >/dev/null || { say "no apt-get: install ${PACKAGES[*]} by hand"; return 0; }
    local missing
    missing=$(missing_packages)
    [ -z "$missing" ] && return 0
    if [ "$(id -u)" != 0 ]; then
        say "not root: cannot install $missing (the bcc backend and fio benchmarks need them)"
        return 0
    fi
    say "installing $missing"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends $missing >/dev/null \
        || say "apt-get failed for: $missing"
}

# bcc compiles against /lib/modules/$(uname -r)/build; kernels without their own headers
# package work for syscall tracepoints with Debian's generic headers linked there.
link_kernel_headers() {
    local mod="/lib/modules/$(uname -r)"
    [ -e "$mod/build/include/linux/kconfig.h" ] && return 0
    [ "$(id -u)" = 0 ] || return 0
    local arch common
    arch=$(ls -d /usr/src/linux-headers-*-amd64 2>/dev/null | sort -V | tail -n 1)
    common=$(ls -d /usr/src/linux-headers-*-common 2>/dev/null | sort -V | tail -n 1)
    [ -n "$arch" ] && [ -n "$common" ] || { say "no kernel headers under /usr/src"; return 0; }
    mkdir -p "$mod"
    ln -sfn "$arch" "$mod/build"
    ln -sfn "$common" "$mod/source"
    say "linked $mod/build -> $arch and $mod/source -> $common"
}

mount_tracefs() {
    [ -d /sys/kernel/tracing/events ] && return 0
    [ "$(id -u)" = 0 ] || return 0
    mount -t tracefs tracefs /sys/kernel/tracing 2>/dev/null && say "mounted tracefs at /sys/kernel/tracing"
}

install_packages
link_kernel_headers
mount_tracefs
exit 0
