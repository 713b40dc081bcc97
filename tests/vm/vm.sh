#!/usr/bin/env bash
# tests/vm/vm.sh - run tests inside a throwaway qemu VM booting Debian's newest kernel.
#
# Why: the host/CI kernel has no ublk (CONFIG_BLK_DEV_UBLK); Debian sid's kernel has it with
# zero copy, user copy, auto buffer registration and user recovery. The kernel is fetched with
# apt through a *private* apt configuration under the cache dir (its own sources.list, lists and
# status file), so the host's apt sources and installed packages are never touched: nothing
# from sid is installed, the packages are only unpacked with dpkg -x.
#
# Usage:
#   vm.sh setup            fetch kernel, build the base initramfs (idempotent, cached)
#   vm.sh run DIR          DIR is packed as /test, the guest runs /test/run.sh; exit code =
#                          its exit code; 124 = host timeout; 125 = no result marker (the VM did
#                          not boot, the kernel panicked or init died)
#   vm.sh shell [DIR]      interactive busybox shell on the serial console (Ctrl-A x quits)
#   vm.sh info             print the kernel version in use
#
# Every dynamically linked ELF file under DIR gets its shared libraries (from ldd on the host)
# copied into the guest at the same absolute paths, so host-built (glibc) test binaries run as is.
#
# Environment (defaults): VM_CACHE (tests/vm/cache)  VM_KFLAV (cloud: cloud|std)
#   VM_KVER (newest in sid, e.g. 7.2.13+deb14)  VM_SMP (2)  VM_MEM (2G)  VM_TIMEOUT (600 s)
#   VM_ACCEL (tcg: tcg|kvm|auto; auto = kvm when /dev/kvm is usable and not PVM)
#   VM_SUITE (sid)  VM_MIRROR (http://deb.debian.org/debian)  VM_APPEND (extra kernel cmdline)
#   VM_MODULES (extra module names to load; kernel-cmdline "mod.param=v" words are passed
#   to their insmod, as modprobe would)  VM_QEMU_ARGS (extra qemu arguments, split on blanks:
#   e.g. "-drive file=IMG,if=none,id=nv0,format=raw -device nvme,serial=x,drive=nv0")
#   VM_LOG (copy of the console output, default $VM_CACHE/last-run.log)  VM_BOOT_RETRIES (1:
#   boots again when the guest kernel died before init ran, i.e. before any test)
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
C=${VM_CACHE:-$HERE/cache}
KFLAV=${VM_KFLAV:-cloud}
SMP=${VM_SMP:-2}
MEM=${VM_MEM:-2G}
TIMEOUT=${VM_TIMEOUT:-600}
ACCEL=${VM_ACCEL:-tcg}
SUITE=${VM_SUITE:-sid}
MIRROR=${VM_MIRROR:-http://deb.debian.org/debian}
# ublk_drv is what we test; loop is the in-guest reference for benchmarks; ext4 for mounting.
MODULES="ublk_drv loop ext4 ${VM_MODULES:-}"

log() { printf '[vm %s] %s\n' "$(date +%T)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

mkdir -p "$C"
# Log of the last run: the test suite greps it for markers.
LOGF=${VM_LOG:-$C/last-run.log}

# ------------------------------------------------------------------ host tools
host_check() {
    local t missing=()
    for t in qemu-system-x86_64 dpkg apt-get xz zstd ldd; do
        command -v "$t" >/dev/null || missing+=("$t")
    done
    [ -x /bin/busybox ] || missing+=(busybox-static)
    command -v mke2fs >/dev/null || missing+=(mke2fs)
    command -v e2fsck >/dev/null || missing+=(e2fsck)
    [ ${#missing[@]} -eq 0 ] || die "missing host tools: ${missing[*]} (run scripts/install-deps.sh)"
    /bin/busybox --list | grep -x cpio > /dev/null || die "/bin/busybox has no cpio applet"
    # a static busybox is the guest's whole userland
    if ldd /bin/busybox >/dev/null 2>&1; then die "/bin/busybox is not static (install busybox-static)"; fi
}

# ------------------------------------------------- kernel via a private apt config
APTDIR=$C/apt
apt_opts() {
    APTO=(-o "Dir::Etc::SourceList=$APTDIR/sources.list" -o Dir::Etc::SourceParts=/dev/null
          -o "Dir::Etc::Preferences=/dev/null" -o Dir::Etc::PreferencesParts=/dev/null
          -o "Dir::State::Lists=$APTDIR/lists" -o "Dir::Cache=$APTDIR/cache"
          -o "Dir::State::Status=$APTDIR/status" -o APT::Architectures=amd64
          -o Acquire::Languages=none -o Acquire::IndexTargets::deb::DEP-11::DefaultEnabled=false
          -o Acquire::IndexTargets::deb::DEP-11-icons::DefaultEnabled=false
          -o Acquire::IndexTargets::deb::Contents-deb::DefaultEnabled=false)
}
apt_update() {
    mkdir -p "$APTDIR/lists/partial" "$APTDIR/cache/archives/partial"
    echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $MIRROR $SUITE main" \
        > "$APTDIR/sources.list"
    : > "$APTDIR/status"   # empty: apt must not consider the host's installed packages
    apt_opts
    log "apt-get update ($SUITE, private config in $APTDIR)"
    apt-get "${APTO[@]}" -q update >&2 || die "apt-get update of $SUITE failed"
}

# The kernel ABI name (e.g. 7.2.13+deb14-cloud-amd64) from the flavour's meta package.
resolve_kv() {
    local meta
    if [ "$KFLAV" = cloud ]; then meta=linux-image-cloud-amd64; else meta=linux-image-amd64; fi
    apt_opts
    if [ -n "${VM_KVER:-}" ]; then
        if [ "$KFLAV" = cloud ]; then echo "$VM_KVER-cloud-amd64"; else echo "$VM_KVER-amd64"; fi
        return
    fi
    apt-cache "${APTO[@]}" depends "$meta" 2>/dev/null |
        sed -n 's/^ *Depends: linux-image-\([0-9].*\)$/\1/p' | head -1
}

fetch_kernel() {
    local kv
    if [ -f "$C/kv" ] && [ -z "${VM_KVER:-}" ]; then
        kv=$(cat "$C/kv")
        [ -f "$C/kernel-$kv/vmlinuz" ] && { KV=$kv; return; }
    fi
    apt_update
    kv=$(resolve_kv)
    [ -n "$kv" ] || die "cannot resolve the newest $KFLAV kernel in $SUITE"
    KV=$kv
    local kd=$C/kernel-$KV debs=$C/debs pkgs p
    if [ ! -f "$kd/vmlinuz" ]; then
        mkdir -p "$debs" "$kd/root"
        apt_opts
        # linux-image-$KV plus whatever it splits into (7.x: linux-binary/-modules/-base-$KV)
        pkgs="linux-image-$KV $(apt-cache "${APTO[@]}" depends "linux-image-$KV" 2>/dev/null |
            sed -n "s/^ *Depends: \(linux-[a-z]*-$KV\)\$/\1/p" | tr '\n' ' ')"
        log "apt-get download $pkgs"
        (cd "$debs" && apt-get "${APTO[@]}" -q download $pkgs) >&2 || die "apt-get download failed"
        for p in $pkgs; do dpkg -x "$(ls "$debs/${p}"_*.deb | head -1)" "$kd/root"; done
        local mdir=$kd/root/usr/lib/modules/$KV
        [ -d "$mdir" ] || mdir=$kd/root/lib/modules/$KV
        [ -f "$mdir/vmlinuz" ] && cp "$mdir/vmlinuz" "$kd/vmlinuz" ||
            cp "$kd/root/boot/vmlinuz-$KV" "$kd/vmlinuz" || die "no vmlinuz in the packages"
        ln -sfn "$mdir" "$kd/modules"
        local cfg=$mdir/config; [ -f "$cfg" ] || cfg=$kd/root/boot/config-$KV
        cp "$cfg" "$kd/config"
        grep -q '^CONFIG_BLK_DEV_UBLK=[ym]' "$kd/config" || die "kernel $KV has no ublk"
    fi
    echo "$KV" > "$C/kv"
}

# ------------------------------------------------------------- kernel modules
mod_file() { # name -> path of the module file (- and _ are interchangeable)
    local n=$1 alt
    alt=$(echo "$n" | tr '_-' '-_')
    find -L "$KD/modules/kernel" \( -name "$n.ko*" -o -name "$alt.ko*" \) | head -1
}
mod_builtin() {
    local n=$1 alt
    alt=$(echo "$n" | tr '_-' '-_')
    grep -qE "/($n|$alt)\.ko$" "$KD/modules/modules.builtin"
}
mod_cat() { case $1 in *.xz) xz -dc "$1" ;; *.zst) zstd -dcq "$1" ;; *.gz) gzip -dc "$1" ;; *) cat "$1" ;; esac; }
ORDER=""
mod_resolve() { # dependencies first; the modules deb has no modules.dep, so read .modinfo
    local n=$1 f d
    case " $ORDER " in *" $n "*) return ;; esac
    mod_builtin "$n" && return
    f=$(mod_file "$n"); [ -n "$f" ] || die "module $n not found in $KV"
    for d in $(mod_cat "$f" | tr '\0' '\n' | sed -n 's/^depends=//p' | tr ',' ' '); do
        mod_resolve "$d"
    done
    ORDER="$ORDER $n"
}

# ------------------------------------------------------------ base initramfs
write_init() {
    cat > "$1/init" <<'EOF'
#!/bin/sh
# PID 1 of the test VM: mount the basics, load modules, run /test/run.sh, print its rc, power off.
export PATH=/test/bin:/test:/bin:/sbin:/usr/bin:/usr/sbin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /dev/shm
mount -t tmpfs tmpfs /tmp
mount -t tmpfs tmpfs /run
# module parameters from the kernel command line (nvme.poll_queues=1): busybox insmod does not
# read them itself
while read -r m; do
    n=$(echo "$m" | tr - _)
    insmod "/lib/modules/$m.ko" $(tr ' ' '\n' < /proc/cmdline | awk -v n="$n" '{ i = index($0, ".");
        if (i > 1) { p = substr($0, 1, i - 1); gsub("-", "_", p); if (p == n) print substr($0, i + 1) } }') ||
        echo "VM insmod $m failed"
done < /lib/modules/load.order
echo "VM_BOOTED kernel=$(uname -r) uptime=$(cut -d' ' -f1 /proc/uptime)"
cd /test 2>/dev/null || cd /
if [ -x /test/run.sh ] && ! grep -q vm_shell=1 /proc/cmdline; then
    /test/run.sh
    rc=$?
else
    echo "VM interactive shell (exit to power off)"
    setsid cttyhack sh
    rc=$?
fi
sync
echo "VM_RC=$rc uptime=$(cut -d' ' -f1 /proc/uptime)"
poweroff -f
EOF
    chmod 755 "$1/init"
}

# copy the shared libraries of ELF file $1 into tree $2 at their absolute paths
copy_libs() {
    local lib
    ldd "$1" >/dev/null 2>&1 || return 0   # static or not an ELF
    for lib in $(ldd "$1" | awk '/=>/ && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}'); do
        [ -e "$2$lib" ] && continue
        mkdir -p "$2$(dirname "$lib")"
        cp -L "$lib" "$2$lib"
    done
}

# one cached base initramfs per module set (the default set keeps the plain name)
base_name() {
    if [ -n "${VM_MODULES:-}" ]; then
        echo "base-$KV-$(echo "$MODULES" | tr ' ' '\n' | sort -u | md5sum | cut -c1-8)"
    else
        echo "base-$KV"
    fi
}

build_base() {
    local b=$C/$(base_name) m a cpio=$C/$(base_name).cpio
    [ -f "$cpio" ] && [ "$cpio" -nt "$0" ] && return
    log "building base initramfs for $KV"
    rm -rf "$b"
    mkdir -p "$b"/{bin,sbin,dev,proc,sys,tmp,run,etc,mnt,test,lib/modules}
    cp /bin/busybox "$b/bin/busybox"
    for a in $(/bin/busybox --list); do [ -e "$b/bin/$a" ] || ln -s busybox "$b/bin/$a"; done
    # e2fsprogs from the host (glibc, libs copied along): mke2fs -d and e2fsck -fn in the guest
    # (busybox has its own, more limited mke2fs/e2fsck applets: drop those links)
    rm -f "$b"/bin/{mke2fs,mkfs.ext2,mkfs.ext3,mkfs.ext4,e2fsck,fsck.ext2,fsck.ext3,fsck.ext4,tune2fs}
    for a in mke2fs e2fsck; do cp "$(command -v $a)" "$b/sbin/$a"; copy_libs "$(command -v $a)" "$b"; done
    ln -sf mke2fs "$b/sbin/mkfs.ext4"
    cp /etc/mke2fs.conf "$b/etc/" 2>/dev/null || true
    ORDER=""
    for m in $MODULES; do mod_resolve "$m"; done
    : > "$b/lib/modules/load.order"
    for m in $ORDER; do
        mod_cat "$(mod_file "$m")" > "$b/lib/modules/$m.ko"   # busybox insmod reads plain .ko only
        echo "$m" >> "$b/lib/modules/load.order"
    done
    log "guest modules:$ORDER"
    write_init "$b"
    (cd "$b" && find . | /bin/busybox cpio -o -H newc -R 0:0 2>/dev/null) > "$cpio.tmp"
    mv "$cpio.tmp" "$cpio"
}

# Unpack the bzImage payload into the uncompressed ELF and boot it through the PVH entry:
# saves ~0.7 s of in-guest decompression under TCG. Falls back to the bzImage.
extract_vmlinux() {
    local bz=$KD/vmlinuz out=$KD/vmlinux ss po pl off
    [ -f "$out" ] || [ -f "$KD/no-pvh" ] && return
    ss=$(od -An -tu1 -j $((0x1f1)) -N1 "$bz" | tr -d ' '); [ "$ss" = 0 ] && ss=4
    po=$(od -An -tu4 -j $((0x248)) -N4 "$bz" | tr -d ' ')
    pl=$(od -An -tu4 -j $((0x24c)) -N4 "$bz" | tr -d ' ')
    off=$(( (ss + 1) * 512 + po ))
    if [ "$(od -An -tx1 -j "$off" -N4 "$bz" | tr -d ' ')" = 28b52ffd ]; then
        # the payload ends in a 4-byte size trailer that zstd calls garbage: ignore its status
        tail -c +$((off + 1)) "$bz" | head -c "$pl" | zstd -dcq > "$out.tmp" 2>/dev/null || true
        if [ "$(head -c4 "$out.tmp" | od -An -tx1 | tr -d ' ')" = 7f454c46 ] &&
           readelf -n "$out.tmp" 2>/dev/null | grep -E 'Unknown note type: \(0x00000012\)|PHYS32_ENTRY' > /dev/null; then
            mv "$out.tmp" "$out"; return
        fi
    fi
    rm -f "$out.tmp"; touch "$KD/no-pvh"
}

setup() {
    host_check
    fetch_kernel
    KD=$C/kernel-$KV
    build_base
    extract_vmlinux
}

# ------------------------------------------------------------------- run
qemu_cmd() {
    local accel=$ACCEL kimg=$KD/vmlinuz
    [ -f "$KD/vmlinux" ] && kimg=$KD/vmlinux
    if [ "$accel" = auto ]; then
        if [ -w /dev/kvm ] && [ ! -d /sys/module/kvm_pvm ]; then accel=kvm; else accel=tcg; fi
    fi
    if [ "$accel" = kvm ]; then accel=(-accel kvm -cpu host); else accel=(-accel tcg,thread=multi -cpu max); fi
    QEMU=(qemu-system-x86_64 -nodefaults -no-user-config -display none -no-reboot
          "${accel[@]}" -m "$MEM" -smp "$SMP" -bios qboot.rom -kernel "$kimg")
}
CMDLINE="console=ttyS0 panic=-1 quiet mitigations=off cryptomgr.notests tsc=reliable no_timer_check"

pack() { # $1 = payload dir (may be empty) -> $RUNCPIO
    local dir=$1 tmp f
    tmp=$(mktemp -d "$WORK/pack.XXXXXX")
    if [ -n "$dir" ]; then cp -a "$dir/." "$tmp/test"; else mkdir "$tmp/test"; fi
    while IFS= read -r f; do
        head -c4 "$f" 2>/dev/null | grep ELF > /dev/null && copy_libs "$f" "$tmp"
    done < <(find "$tmp/test" -type f -perm -u+x)
    (cd "$tmp" && find . -mindepth 1 | /bin/busybox cpio -o -H newc -R 0:0 2>/dev/null) > "$WORK/payload.cpio"
    rm -rf "$tmp"
    RUNCPIO=$WORK/run.cpio
    cat "$C/$(base_name).cpio" "$WORK/payload.cpio" > "$RUNCPIO"
}

run_dir() {
    local dir=${1:?usage: vm.sh run DIR} t0 rc
    [ -x "$dir/run.sh" ] || die "$dir/run.sh missing or not executable"
    setup
    # tmpfs for the initramfs when available: the host disk may be slow or throttled
    WORK=$(mktemp -d "${VM_WORK:-/dev/shm}/snapblk-vm.XXXXXX" 2>/dev/null || mktemp -d)
    trap 'rm -rf "$WORK"' EXIT
    t0=$(date +%s.%N)
    pack "$dir"
    qemu_cmd
    local try=0
    while :; do
        log "booting $KV ($(du -h "$RUNCPIO" | cut -f1) initramfs, ${SMP} cpus, $MEM, timeout ${TIMEOUT}s)"
        set +e
        # shellcheck disable=SC2086 # VM_QEMU_ARGS is a blank-separated argument list
        timeout --foreground -k 5 "$TIMEOUT" "${QEMU[@]}" ${VM_QEMU_ARGS:-} -serial stdio -initrd "$RUNCPIO" \
            -append "$CMDLINE ${VM_APPEND:-}" < /dev/null 2>&1 | tee "$LOGF"
        rc=${PIPESTATUS[0]}
        set -e
        # A guest kernel that dies before init runs (seen ~1 in 30 TCG boots: an int3 Oops in
        # the timer softirq during boot) has not run any test: boot again, at most
        # VM_BOOT_RETRIES times. A crash after VM_BOOTED is never retried.
        if [ "$rc" != 124 ] && [ "$rc" != 137 ] && ! grep -qa '^VM_BOOTED' "$LOGF" &&
           [ "$try" -lt "${VM_BOOT_RETRIES:-1}" ]; then
            try=$((try + 1))
            cp "$LOGF" "$LOGF.boot-failure"
            log "the guest kernel died before init (log kept in $LOGF.boot-failure): boot retry $try"
            continue
        fi
        break
    done
    if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
        log "TIMEOUT after ${TIMEOUT}s"; rc=124
    elif grep -qa '^VM_RC=' "$LOGF"; then
        rc=$(grep -ao '^VM_RC=[0-9]*' "$LOGF" | tail -1 | cut -d= -f2)
    else
        log "no VM_RC marker (qemu rc=$rc): the VM did not boot or the guest crashed"; rc=125
    fi
    log "guest rc=$rc, wall $(awk "BEGIN{printf \"%.1f\", $(date +%s.%N) - $t0}") s (log: $LOGF)"
    return "$rc"
}

shell_vm() {
    setup
    WORK=$(mktemp -d); trap 'rm -rf "$WORK"' EXIT
    pack "${1:-}"
    qemu_cmd
    # shellcheck disable=SC2086
    "${QEMU[@]}" ${VM_QEMU_ARGS:-} -serial mon:stdio -initrd "$RUNCPIO" -append "$CMDLINE vm_shell=1 ${VM_APPEND:-}"
}

case ${1:-} in
    setup) setup; log "ready: kernel $KV" ;;
    run) shift; run_dir "$@" ;;
    shell) shift; shell_vm "$@" ;;
    info) setup; echo "$KV" ;;
    *) sed -n '2,29p' "$0"; exit 2 ;;
esac
