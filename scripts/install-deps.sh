#!/usr/bin/env bash
# Installs the Debian packages the build, the tests and the benchmarks use.
# Idempotent; safe to run on every CI start. Needs root (or sudo).
set -euo pipefail
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO=sudo
PKGS=(
  build-essential pkg-config        # C tests of the libblkio ABI
  fio                               # reference load generator (bench agreement, libblkio engine)
  qemu-utils                        # qemu-img / qemu-nbd: NBD interop tests, reference server
  libnbd-bin                        # nbdinfo / nbdcopy: NBD interop tests
  fuse3                             # fusermount3 for the FUSE export
  e2fsprogs                         # mke2fs -d / e2fsck: ext4 images in tests
  vmtouch                           # residency reference in bench/
  time                              # /usr/bin/time: CPU seconds in scripts/fuzz-campaign.sh
  qemu-system-x86                   # the ublk VM (software emulation)
  qemu-system-common                # qemu-storage-daemon: vhost-user-blk and VDUSE backends for the driver tests
  iproute2                          # vdpa (/sbin/vdpa): binds the VDUSE device to vhost-vdpa in tests/suites/vdpa-vm.sh
  cpio busybox-static kmod zstd xz-utils  # initramfs for the ublk VM
  android-sdk-libsparse-utils       # img2simg / simg2img: sparse-image tests
  libclang-dev                      # bindgen in libublk-rs-sys (ublk export) needs libclang
  python3 python3-venv bzip2        # OTA tests: zips by zipfile, the payload-dumper venv, tar -j
  bsdiff                            # OTA apply tests: BSDIFF40 patches from an independent maker
  cryptsetup-bin                    # veritysetup: the dm-verity hash tree and FEC reference (OTA tests)
  libfec-dev                        # Karn's Reed-Solomon library (init_rs_char): the FEC encoder's reference
  zip gzip                          # PUFFDIFF tests: deflate streams by Info-ZIP zip and GNU gzip
  openssl                           # OTA signature tests: keys, certificates and signatures by the openssl CLI
  ceph-mon ceph-osd ceph-common uuid-runtime  # scripts/ceph-cluster.sh: a single-node Ceph (rbd driver tests); librbd1 comes with them
  radosgw                           # scripts/ceph-cluster.sh: Ceph's S3 gateway on the same cluster
  qemu-block-extra                  # qemu-img/qemu-io rbd:…: an independent RBD client for the rbd tests
)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# The fuzz smoke suites (tests/suites/*-fuzz.sh) build libFuzzer targets with a nightly rustc
# (coverage instrumentation needs unstable flags). Install it with rustup when it is missing.
if ! rustc +nightly -vV >/dev/null 2>&1; then
  if command -v rustup >/dev/null 2>&1; then
    rustup toolchain install nightly --profile minimal
  else
    echo "install-deps: no rustup: the fuzz suites need a nightly toolchain (https://rustup.rs)" >&2
  fi
fi
