//! snapblk facade: the driver registry and device specs.
//!
//! [`create`] makes a [`Blkio`] instance for a driver name (`io_uring`, `sync`, `null`,
//! `snapshot`, `virtio-blk-vhost-user`, `nvme-io_uring`, `virtio-blk-vhost-vdpa`, `virtio-blk-vfio-pci`,
//! `rbd`, and the read-only `s3` / `http` remote-object driver); [`open`] parses a *device spec*, sets its properties, connects and starts it.
//!
//! Each driver is a cargo feature of this crate (`io_uring`, `sync`, `null`, `snapshot`, all on
//! by default), as in libblkio: a build without a driver knows no such name ([`DRIVERS`]).
//!
//! # Device spec grammar
//!
//! ```text
//! spec   := PATH                         a file or block device, opened with the io_uring driver
//!         | URL                          s3://BUCKET/KEY, http://… or https://…: the read-only
//!                                        `s3` / `http` driver with `url=URL` (feature `remote`)
//!         | DRIVER ":" [prop ("," prop)*]
//! prop   := NAME "=" VALUE               a property set before connect
//! ```
//!
//! * A spec is `DRIVER:...` when the text before the first `:` is a registered driver name;
//!   otherwise the whole spec is a path (so `./a:b` or `/x/io_uring:1` are paths). A spec that
//!   looks like `NAME:...` (`NAME` made of `[A-Za-z0-9_-]`) where `NAME` is no driver and no
//!   file of that whole name exists is refused as `unknown driver 'NAME' (known: ...)` rather
//!   than as a missing file.
//! * `NAME` is a property name as in libblkio (`path`, `direct`, `read-only`, `size`, ...).
//!   `VALUE` is parsed into the property's type with the strict libblkio parsers, except that
//!   u64 properties also accept a size suffix `k`, `M`, `G`, `T`, `P`, optionally followed by
//!   `iB` or `B` (binary: 1k = 1KiB = 1024; [`snapblk_core::parse_size`]) and bools
//!   also accept `1`/`0`/`yes`/`no`. A value cannot contain `,`. A key given twice is refused.
//! * Capacity properties ([`CAPACITY_PROPS`], e.g. `null:size`) must be a multiple of 512 and
//!   at most 2^63-1 (an offset must fit in a signed 64-bit integer), checked here rather than
//!   at the first I/O. These checks are the spec layer's: the C API's property setters keep
//!   libblkio's behaviour.
//! * Properties whose access is "connected" (`num-entries`, `num-queues`, ...) are set after
//!   connect, in spec order; everything else before connect.
//! * **Nested devices** use dotted keys, as QEMU does: a driver that opens another device (the
//!   snapshot driver's `base`) takes `base.driver=DRIVER` and `base.NAME=VALUE` for each of
//!   that device's properties, e.g.
//!   `snapshot:cow=C,base.driver=rbd,base.pool=p,base.image=i`; deeper levels nest the same way
//!   (`base.base.driver=...`). The C ABI takes the same names (`blkio_set_str(b,
//!   "base.driver", "rbd")`). A dotted key has no empty part ([`Spec::child`] gathers one
//!   child's properties).
//!
//! Examples: `/dev/zram0`, `null:size=1G`, `io_uring:path=/dev/zram0,direct=true`,
//! `sync:path=disk.img,read-only=true`, `snapshot:base=B,cow=C,writable=true`,
//! `snapshot:cow=C,base.driver=io_uring,base.path=B`, `s3:url=s3://bucket/disk.img,cache-size=256M`.
//!
//! Everything is at the root, except `fuzzing`: the fuzz harness of the spec parser, test
//! scaffolding public only with the `test-utils` feature (for crates/snapblk/fuzz), in its own
//! namespace so it never reads as part of the API.
#![warn(missing_docs)]
#![warn(unreachable_pub, unnameable_types)]

use snapblk_core::{Access, PropType, PropValue, parse_size};
#[cfg(any(test, feature = "test-utils"))]
pub mod fuzzing;
pub use snapblk_core::{Blkio, Error, Result};

/// Driver names [`create`] knows: those of the enabled features.
pub const DRIVERS: &[&str] = &[
    #[cfg(feature = "io_uring")]
    "io_uring",
    #[cfg(feature = "sync")]
    "sync",
    #[cfg(feature = "virtio-blk-vhost-user")]
    "virtio-blk-vhost-user",
    #[cfg(feature = "nvme-io_uring")]
    "nvme-io_uring",
    #[cfg(feature = "virtio-blk-vhost-vdpa")]
    "virtio-blk-vhost-vdpa",
    #[cfg(feature = "virtio-blk-vfio-pci")]
    "virtio-blk-vfio-pci",
    #[cfg(feature = "null")]
    "null",
    #[cfg(feature = "rbd")]
    "rbd",
    #[cfg(feature = "snapshot")]
    "snapshot",
    #[cfg(feature = "fault-injection")]
    "fault",
    #[cfg(feature = "remote")]
    "s3",
    #[cfg(feature = "remote")]
    "http",
];

/// Properties that give a device's capacity in bytes: checked by the spec parser (multiple of
/// 512, at most 2^63-1).
pub const CAPACITY_PROPS: &[&str] = &["size"];

/// Largest capacity a spec accepts: every byte offset must fit in an `i64` (`off_t`).
pub const MAX_CAPACITY: u64 = i64::MAX as u64;

/// A new instance of driver `driver` in the created state (ENOENT `Unknown driver name` for an
/// unknown name, like `blkio_create`).
pub fn create(driver: &str) -> Result<Blkio> {
    let d: Box<dyn snapblk_core::Driver> = match driver {
        #[cfg(feature = "io_uring")]
        "io_uring" => Box::new(snapblk_drivers::UringDriver::new()),
        #[cfg(feature = "sync")]
        "sync" => Box::new(snapblk_drivers::SyncDriver::new()),
        #[cfg(feature = "null")]
        "null" => Box::new(snapblk_drivers::NullDriver::new()),
        #[cfg(feature = "virtio-blk-vhost-user")]
        "virtio-blk-vhost-user" => Box::new(snapblk_drivers::VhostUserDriver::new()),
        #[cfg(feature = "nvme-io_uring")]
        "nvme-io_uring" => Box::new(snapblk_drivers::NvmeDriver::new()),
        #[cfg(feature = "virtio-blk-vhost-vdpa")]
        "virtio-blk-vhost-vdpa" => Box::new(snapblk_drivers::VhostVdpaDriver::new()),
        #[cfg(feature = "virtio-blk-vfio-pci")]
        "virtio-blk-vfio-pci" => Box::new(snapblk_drivers::VfioPciDriver::new()),
        #[cfg(feature = "rbd")]
        "rbd" => Box::new(snapblk_drivers::RbdDriver::new()),
        #[cfg(feature = "snapshot")]
        "snapshot" => Box::new(snapblk_snapshot::SnapshotDriver::with_opener(open_child)),
        #[cfg(feature = "fault-injection")]
        "fault" => Box::new(snapblk_snapshot::fault::FaultDriver::configurable()),
        #[cfg(feature = "remote")]
        "s3" => Box::new(snapblk_remote::RemoteDriver::new("s3")),
        #[cfg(feature = "remote")]
        "http" => Box::new(snapblk_remote::RemoteDriver::new("http")),
        _ => return Err(Error::new(libc::ENOENT, "Unknown driver name")),
    };
    Ok(Blkio::new(d))
}

/// A parsed device spec: driver name and `(property, value)` pairs in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spec {
    /// The driver name (`io_uring` for a bare path).
    pub driver: String,
    /// `(property, value)` pairs in the order given; a bare path becomes `("path", PATH)`.
    pub props: Vec<(String, String)>,
}

/// Parse a device spec (see the crate docs).
pub fn parse_spec(spec: &str) -> Result<Spec> {
    if spec.is_empty() {
        return Err(Error::new(libc::EINVAL, "empty device spec"));
    }
    #[cfg(feature = "remote")]
    if snapblk_remote::is_remote(spec) {
        let s3 = spec
            .get(..5)
            .is_some_and(|h| h.eq_ignore_ascii_case("s3://"));
        return Ok(Spec {
            driver: if s3 { "s3" } else { "http" }.to_owned(),
            props: vec![("url".to_owned(), spec.to_owned())],
        });
    }
    if let Some((drv, rest)) = spec.split_once(':') {
        if DRIVERS.contains(&drv) {
            let mut props: Vec<(String, String)> = Vec::new();
            for kv in rest.split(',').filter(|s| !s.is_empty()) {
                let Some((k, v)) = kv.split_once('=') else {
                    return Err(Error::new(
                        libc::EINVAL,
                        format!("device spec: expected key=value, got {kv:?}"),
                    ));
                };
                if k.is_empty() || k.split('.').any(str::is_empty) {
                    return Err(Error::new(
                        libc::EINVAL,
                        format!("device spec: empty property name in {kv:?}"),
                    ));
                }
                if props.iter().any(|(seen, _)| seen == k) {
                    return Err(Error::new(
                        libc::EINVAL,
                        format!("duplicate key '{k}' in device spec"),
                    ));
                }
                props.push((k.to_owned(), v.to_owned()));
            }
            return Ok(Spec {
                driver: drv.to_owned(),
                props,
            });
        }
        let word = !drv.is_empty()
            && drv
                .bytes()
                .all(|c| c.is_ascii_alphanumeric() || c == b'_' || c == b'-');
        // symlink_metadata: a dangling symlink of that name is a path the user means.
        if word && std::fs::symlink_metadata(spec).is_err() {
            return Err(unknown_driver(drv));
        }
    }
    Ok(Spec {
        driver: "io_uring".to_owned(),
        props: vec![("path".to_owned(), spec.to_owned())],
    })
}

/// ENOENT `unknown driver 'NAME' (known: a, b, ...)`, the known names sorted.
fn unknown_driver(name: &str) -> Error {
    let mut known = DRIVERS.to_vec();
    known.sort_unstable();
    Error::new(
        libc::ENOENT,
        format!("unknown driver '{name}' (known: {})", known.join(", ")),
    )
}

/// Checks a capacity property's value ([`CAPACITY_PROPS`]).
fn check_capacity(name: &str, n: u64) -> Result<()> {
    if n > MAX_CAPACITY {
        return Err(Error::new(
            libc::EINVAL,
            format!("{name}: {n} is more than the largest capacity, 2^63-1 bytes"),
        ));
    }
    if !n.is_multiple_of(512) {
        return Err(Error::new(
            libc::EINVAL,
            format!("{name}: {n} is not a multiple of 512 bytes"),
        ));
    }
    Ok(())
}

/// Set one spec property, with the spec grammar's relaxed value syntax.
fn set_spec_prop(b: &mut Blkio, name: &str, value: &str) -> Result<()> {
    let ty = b.prop_specs().find(|p| p.name == name).map(|p| p.ty);
    let v = match ty {
        Some(PropType::U64) => match parse_size(value) {
            Ok(n) => {
                if CAPACITY_PROPS.contains(&name) {
                    check_capacity(name, n)?;
                }
                PropValue::U64(n)
            }
            Err(_) => {
                return Err(Error::new(
                    libc::EINVAL,
                    format!("{name}: invalid size {value:?}"),
                ));
            }
        },
        Some(PropType::Bool) => match value {
            "true" | "1" | "yes" | "on" => PropValue::Bool(true),
            "false" | "0" | "no" | "off" => PropValue::Bool(false),
            _ => {
                return Err(Error::new(
                    libc::EINVAL,
                    format!("{name}: expected true or false, got {value:?}"),
                ));
            }
        },
        _ => return b.set_str(name, value).map_err(|e| prefix(name, e)),
    };
    b.set(name, v).map_err(|e| prefix(name, e))
}

fn prefix(name: &str, e: Error) -> Error {
    Error::new(e.errno, format!("{name}: {}", e.msg))
}

/// Open a device spec: create, set properties, connect, set `num-queues` (and connected-state
/// properties from the spec), start. `num_queues` must be >= 0.
pub fn open(spec: &str, num_queues: i32) -> Result<Blkio> {
    open_spec(&parse_spec(spec)?, num_queues)
}

impl Spec {
    /// True when the spec sets property `key`.
    pub fn has(&self, key: &str) -> bool {
        self.props.iter().any(|(k, _)| k == key)
    }

    /// The spec of the nested device `name` (`name.driver=D,name.K=V` → driver `D`, `K=V`),
    /// `None` when the spec has no `name.driver`.
    pub fn child(&self, name: &str) -> Option<Spec> {
        let mut driver = None;
        let mut props = Vec::new();
        for (k, v) in &self.props {
            let Some(rest) = k.strip_prefix(name).and_then(|r| r.strip_prefix('.')) else {
                continue;
            };
            if rest == "driver" {
                driver = Some(v.clone());
            } else {
                props.push((rest.to_owned(), v.clone()));
            }
        }
        Some(Spec {
            driver: driver?,
            props,
        })
    }
}

/// The opener the snapshot driver gets for a base given as a device spec: the device started
/// with up to [`snapblk_snapshot::BASE_QUEUES`] queues (unless the spec sets `num-queues`),
/// read-only unless `writable` (or the spec sets `read-only` itself). `snapblk merge --base
/// SPEC` opens its device base the same way.
#[cfg(feature = "snapshot")]
pub fn open_child(driver: &str, props: &[(String, String)], writable: bool) -> Result<Blkio> {
    if !DRIVERS.contains(&driver) {
        return Err(unknown_driver(driver));
    }
    let mut s = Spec {
        driver: driver.to_owned(),
        props: props.to_vec(),
    };
    if !writable && !s.has("read-only") {
        s.props.push(("read-only".to_owned(), "true".to_owned()));
    }
    let mut b = connect_spec(&s)?;
    if !s.has("num-queues") {
        let n = b
            .get_int("max-queues")?
            .clamp(1, snapblk_snapshot::BASE_QUEUES);
        b.set_int("num-queues", n)?;
    }
    b.start()?;
    Ok(b)
}

/// [`open`] for an already parsed spec (e.g. one a caller added defaults to).
pub fn open_spec(s: &Spec, num_queues: i32) -> Result<Blkio> {
    let mut b = create(&s.driver)?;
    set_spec_props(&mut b, s, false)?;
    b.connect()?;
    b.set_int("num-queues", num_queues)?;
    set_spec_props(&mut b, s, true)?;
    b.start()?;
    Ok(b)
}

/// Like [`open_spec`], but the instance is left connected (not started), for callers that pick
/// `num-queues` from the device's properties; connected-state properties of the spec are set.
pub fn connect_spec(s: &Spec) -> Result<Blkio> {
    let mut b = create(&s.driver)?;
    set_spec_props(&mut b, s, false)?;
    b.connect()?;
    set_spec_props(&mut b, s, true)?;
    Ok(b)
}

/// Set the spec's properties whose access is "connected" (`late`) or all the others.
fn set_spec_props(b: &mut Blkio, s: &Spec, late: bool) -> Result<()> {
    for (k, v) in &s.props {
        let is_late = b
            .prop_specs()
            .any(|p| p.name == k && p.access == Access::RwConnected);
        if is_late == late {
            set_spec_prop(b, k, v)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use snapblk_core::QueueExt;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4k").ok(), Some(4096));
        assert_eq!(parse_size("1G").ok(), Some(1 << 30));
        assert_eq!(parse_size("512").ok(), Some(512));
        assert_eq!(parse_size("x").ok(), None);
        assert_eq!(parse_size("").ok(), None);
        assert_eq!(parse_size("99999999999T").ok(), None);
    }

    #[test]
    fn spec_grammar() {
        let s = parse_spec("io_uring:path=/dev/zram0,direct=true").unwrap();
        assert_eq!(s.driver, "io_uring");
        assert_eq!(
            s.props,
            vec![
                ("path".into(), "/dev/zram0".into()),
                ("direct".into(), "true".into())
            ]
        );
        let p = parse_spec("/tmp/a:b").unwrap();
        assert_eq!(p.driver, "io_uring");
        assert_eq!(p.props, vec![("path".into(), "/tmp/a:b".into())]);
        assert!(parse_spec("null:size").is_err());
        assert!(parse_spec("").is_err());
        assert_eq!(parse_spec("null:").unwrap().props, vec![]);
    }

    #[test]
    #[cfg(feature = "remote")]
    fn a_bare_url_is_the_remote_driver() {
        let s = parse_spec("s3://bkt/a,b=c").unwrap();
        assert_eq!(s.driver, "s3");
        assert_eq!(s.props, vec![("url".into(), "s3://bkt/a,b=c".into())]);
        assert_eq!(parse_spec("HTTPS://h/x").unwrap().driver, "http");
        let s = parse_spec("http:url=http://h/x,cache-size=1M").unwrap();
        assert_eq!(s.driver, "http");
        assert_eq!(s.props[1], ("cache-size".into(), "1M".into()));
        // Connecting checks the URL before any request.
        let Err(e) = open("s3:url=s3://bkt", 1) else {
            panic!("an s3:// URL without a key opened");
        };
        assert_eq!(e.errno, libc::EINVAL, "{e}");
    }

    #[test]
    #[cfg_attr(
        not(all(
            feature = "io_uring",
            feature = "sync",
            feature = "null",
            feature = "snapshot",
            feature = "virtio-blk-vhost-user",
            feature = "nvme-io_uring",
            feature = "virtio-blk-vhost-vdpa",
            feature = "virtio-blk-vfio-pci",
            feature = "remote",
            feature = "rbd"
        )),
        ignore = "the message lists every driver"
    )]
    fn unknown_driver_in_a_spec_is_named() {
        #[cfg(not(feature = "fault-injection"))]
        let known = "http, io_uring, null, nvme-io_uring, rbd, s3, snapshot, sync, virtio-blk-vfio-pci, virtio-blk-vhost-user, virtio-blk-vhost-vdpa";
        #[cfg(feature = "fault-injection")]
        let known = "fault, http, io_uring, null, nvme-io_uring, rbd, s3, snapshot, sync, virtio-blk-vfio-pci, virtio-blk-vhost-user, virtio-blk-vhost-vdpa";
        for (spec, name) in [
            ("nosuch:size=1G", "nosuch"),
            ("NULL:size=1G", "NULL"),
            ("my_drv-2:", "my_drv-2"),
        ] {
            let e = parse_spec(spec).unwrap_err();
            assert_eq!(e.errno, libc::ENOENT, "{spec}");
            assert_eq!(e.msg, format!("unknown driver '{name}' (known: {known})"));
        }
        // Not a driver-like name: still a path (open reports the missing file).
        for spec in [":size=1G", "./nosuch:size=1G", "/x/io_uring:1", "a b:c"] {
            let s = parse_spec(spec).unwrap();
            assert_eq!(s.driver, "io_uring", "{spec}");
        }
        // An existing file whose name looks like a spec stays a path.
        let dir = std::env::temp_dir().join(format!("snapblk-facade-drv-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let colon_file = dir.join("disk:1");
        std::fs::write(&colon_file, b"").unwrap();
        let spec = colon_file.display().to_string();
        assert_eq!(parse_spec(&spec).unwrap().props[0].1, spec);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn dotted_keys_name_nested_devices() {
        let s = parse_spec("snapshot:cow=C,base.driver=rbd,base.pool=p,base.image=i,writable=true")
            .unwrap();
        assert_eq!(s.driver, "snapshot");
        assert_eq!(
            s.props,
            vec![
                ("cow".into(), "C".into()),
                ("base.driver".into(), "rbd".into()),
                ("base.pool".into(), "p".into()),
                ("base.image".into(), "i".into()),
                ("writable".into(), "true".into()),
            ]
        );
        let b = s.child("base").unwrap();
        assert_eq!(b.driver, "rbd");
        assert_eq!(
            b.props,
            vec![("pool".into(), "p".into()), ("image".into(), "i".into())]
        );
        assert!(s.child("cow").is_none(), "no cow.driver: no child");
        assert!(s.child("bas").is_none(), "a prefix must end at a dot");
        // Two levels: a snapshot over a snapshot over a file.
        let s = parse_spec("snapshot:cow=C2,base.driver=snapshot,base.cow=C1,base.base.driver=sync,base.base.path=B")
            .unwrap();
        let b = s.child("base").unwrap();
        assert_eq!(b.driver, "snapshot");
        let bb = b.child("base").unwrap();
        assert_eq!(
            (bb.driver.as_str(), bb.props.clone()),
            ("sync", vec![("path".into(), "B".into())])
        );
        // Values may hold dots and colons; names may not have empty parts.
        let s = parse_spec("snapshot:base.driver=rbd,base.mon-host=127.0.0.1:6789").unwrap();
        assert_eq!(s.child("base").unwrap().props[0].1, "127.0.0.1:6789");
        for bad in [
            "snapshot:base.=x",
            "snapshot:.x=1",
            "snapshot:base..a=1",
            "snapshot:=1",
        ] {
            let e = parse_spec(bad).unwrap_err();
            assert_eq!(e.errno, libc::EINVAL, "{bad}");
            assert!(
                e.msg.starts_with("device spec: empty property name"),
                "{bad}: {}",
                e.msg
            );
        }
        let e = parse_spec("snapshot:base.driver=a,base.driver=b").unwrap_err();
        assert_eq!(e.msg, "duplicate key 'base.driver' in device spec");
    }

    #[test]
    fn duplicate_keys_are_refused() {
        let e = parse_spec("null:size=1G,size=2G").unwrap_err();
        assert_eq!(e.errno, libc::EINVAL);
        assert_eq!(e.msg, "duplicate key 'size' in device spec");
        let e = parse_spec("io_uring:path=/a,direct=true,path=/b").unwrap_err();
        assert_eq!(e.msg, "duplicate key 'path' in device spec");
        assert!(parse_spec("null:size=1G,").is_ok());
    }

    #[test]
    #[cfg_attr(not(feature = "null"), ignore = "needs the null driver")]
    fn capacities_are_checked_where_parsed() {
        let msg = |spec: &str| open(spec, 1).err().map(|e| (e.errno, e.msg.into_owned()));
        assert_eq!(
            msg("null:size=513"),
            Some((
                libc::EINVAL,
                "size: 513 is not a multiple of 512 bytes".into()
            ))
        );
        assert_eq!(
            msg("null:size=18446744073709551615"),
            Some((
                libc::EINVAL,
                "size: 18446744073709551615 is more than the largest capacity, 2^63-1 bytes".into()
            ))
        );
        assert_eq!(
            msg("null:size=8T").map(|m| m.0),
            None,
            "8 TiB is a valid capacity"
        );
        // 2^63-1 itself is not a multiple of 512; the largest valid capacity is below it.
        assert!(msg("null:size=9223372036854775807").is_some());
        let top = MAX_CAPACITY / 512 * 512;
        let b = open(&format!("null:size={top}"), 1).unwrap();
        assert_eq!(b.get_u64("capacity").unwrap(), top);
        assert!(open("null:size=0", 1).is_ok());
        // The size grammar is the bench's: `4KiB` in a spec means what `--bs 4KiB` means.
        let b = open("null:size=4KiB", 1).unwrap();
        assert_eq!(b.get_u64("capacity").unwrap(), 4096);
        assert_eq!(
            msg("null:size=4x"),
            Some((libc::EINVAL, "size: invalid size \"4x\"".into()))
        );
        // Only capacities: other u64 properties keep their own rules.
        assert!(!CAPACITY_PROPS.contains(&"cache-size"));
    }

    #[cfg(feature = "fault-injection")]
    #[test]
    fn fault_driver_opens_from_a_spec_and_fails_its_bad_range() {
        use snapblk_core::QueueExt;
        let mut b = open("fault:size=1M,bad-offset=8192,bad-length=512", 1).unwrap();
        assert_eq!(b.get_u64("capacity").unwrap(), 1 << 20);
        let q = b.queue(0, false).unwrap();
        let mut buf = [0u8; 4096];
        q.read_at(4096, &mut buf).unwrap();
        assert_eq!(q.read_at(8192, &mut buf).unwrap_err().errno, libc::EIO);
    }

    #[test]
    fn connect_spec_leaves_the_instance_connected_with_late_props_set() {
        let s = parse_spec("null:size=8M,num-queues=3").unwrap();
        let mut b = connect_spec(&s).unwrap();
        assert_eq!(b.state(), snapblk_core::State::Connected);
        assert_eq!(b.get_int("num-queues").unwrap(), 3);
        assert_eq!(b.get_u64("capacity").unwrap(), 8 << 20);
        b.start().unwrap();
        assert!(b.queue(2, false).is_some());
    }

    #[test]
    fn unknown_driver_is_enoent() {
        assert_eq!(create("nope").err().unwrap().errno, libc::ENOENT);
    }

    #[test]
    fn create_knows_exactly_the_drivers_of_the_enabled_features() {
        for name in [
            "io_uring",
            "sync",
            "null",
            "snapshot",
            "fault",
            "virtio-blk-vhost-user",
            "nvme-io_uring",
            "virtio-blk-vhost-vdpa",
            "virtio-blk-vfio-pci",
            "s3",
            "http",
            "rbd",
        ] {
            match create(name) {
                Ok(_) => assert!(DRIVERS.contains(&name), "{name} created but not listed"),
                Err(e) => {
                    assert!(
                        !DRIVERS.contains(&name),
                        "{name} listed but not created: {e:?}"
                    );
                    assert_eq!((e.errno, &*e.msg), (libc::ENOENT, "Unknown driver name"));
                }
            }
        }
        assert_eq!(
            DRIVERS.len(),
            usize::from(cfg!(feature = "io_uring"))
                + usize::from(cfg!(feature = "sync"))
                + usize::from(cfg!(feature = "null"))
                + usize::from(cfg!(feature = "snapshot"))
                + usize::from(cfg!(feature = "virtio-blk-vhost-user"))
                + usize::from(cfg!(feature = "nvme-io_uring"))
                + usize::from(cfg!(feature = "virtio-blk-vhost-vdpa"))
                + usize::from(cfg!(feature = "virtio-blk-vfio-pci"))
                + usize::from(cfg!(feature = "fault-injection"))
                + 2 * usize::from(cfg!(feature = "remote"))
                + usize::from(cfg!(feature = "rbd"))
        );
    }

    #[test]
    #[cfg_attr(not(feature = "null"), ignore = "needs the null driver")]
    fn open_null_with_suffix_and_late_props() {
        let mut b = open("null:size=8M,num-queues=2", 1).unwrap();
        assert_eq!(b.get_u64("capacity").unwrap(), 8 << 20);
        assert_eq!(b.get_int("num-queues").unwrap(), 2);
        let q = b.queue(1, false).unwrap();
        let mut buf = vec![1u8; 4096];
        q.read_at(0, &mut buf).unwrap();
        assert!(buf.iter().all(|&x| x == 0));
        assert!(open("null:size=abc", 1).is_err());
        assert!(open("null:bogus=1", 1).is_err());
    }

    #[test]
    #[cfg_attr(
        not(all(feature = "io_uring", feature = "sync")),
        ignore = "needs the io_uring and sync drivers"
    )]
    fn open_path_and_sync() {
        let dir = std::env::temp_dir().join(format!("snapblk-facade-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("img");
        std::fs::write(&f, vec![7u8; 65536]).unwrap();
        for spec in [
            f.display().to_string(),
            format!("sync:path={},read-only=1", f.display()),
        ] {
            let mut b = open(&spec, 1).unwrap();
            assert_eq!(b.get_u64("capacity").unwrap(), 65536);
            let q = b.queue(0, false).unwrap();
            let mut buf = vec![0u8; 512];
            q.read_at(4096, &mut buf).unwrap();
            assert!(buf.iter().all(|&x| x == 7));
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
