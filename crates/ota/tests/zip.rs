//! OTA zips made by an independent writer (Python's `zipfile`, zip64 forced), bare payloads
//! with `payload_properties.txt` beside them, and what is refused.

use std::path::{Path, PathBuf};

use snapblk_ota::testing::{Encoding, PayloadBuilder, extract_to_memory};
use snapblk_ota::{Check, Container, Ota, OtaError, Payload, Properties, PropertiesOrigin};
use snapblk_testsupport::{TempDir, pattern, tool_ok};

/// Writes a zip with Python's zipfile: `entries` are (name, file, method) with method
/// `stored`, `stored64` (stored, zip64 headers forced) or `deflated`; `filler` adds that many
/// small entries first (65,536 make the archive itself zip64).
const MAKE_ZIP: &str = r#"
import sys, zipfile
out, filler = sys.argv[1], int(sys.argv[2])
with zipfile.ZipFile(out, "w") as z:
    z.writestr(zipfile.ZipInfo("META-INF/com/android/metadata"), b"ota-type=AB\n" * 10,
               compress_type=zipfile.ZIP_DEFLATED)
    for i in range(filler):
        z.writestr(zipfile.ZipInfo(f"f/{i}"), b"")
    for spec in sys.argv[3:]:
        name, path, method = spec.split(":")
        info = zipfile.ZipInfo(name)
        info.compress_type = zipfile.ZIP_DEFLATED if method == "deflated" else zipfile.ZIP_STORED
        with open(path, "rb") as src, z.open(info, "w", force_zip64=(method == "stored64")) as dst:
            dst.write(src.read())
"#;

fn make_zip(out: &Path, filler: usize, entries: &[(&str, &Path, &str)]) {
    let mut args = vec![
        "-c".to_string(),
        MAKE_ZIP.to_string(),
        out.display().to_string(),
        filler.to_string(),
    ];
    for (n, p, m) in entries {
        args.push(format!("{n}:{}:{m}", p.display()));
    }
    let a: Vec<&str> = args.iter().map(String::as_str).collect();
    tool_ok("python3", &a);
}

struct Fixture {
    dir: TempDir,
    images: Vec<Vec<u8>>,
    payload: PathBuf,
    props: PathBuf,
}

fn fixture() -> Fixture {
    let dir = TempDir::new("ota-zip");
    let images = vec![
        pattern(40 * 4096, 1),
        vec![0u8; 3 * 4096],
        pattern(4096 + 17, 3),
    ];
    let bytes = PayloadBuilder::new()
        .partition("system", &images[0], 4, &[Encoding::Xz, Encoding::Bz])
        .partition("misc", &images[1], 1, &[Encoding::Replace])
        .partition("boot", &images[2], 1, &[Encoding::Zstd, Encoding::Replace])
        .bytes();
    let payload = dir.join("payload.bin");
    std::fs::write(&payload, &bytes).unwrap();
    let text = Properties::render(&Payload::from_bytes(bytes).unwrap()).unwrap();
    let props = dir.join("props.txt");
    std::fs::write(&props, text).unwrap();
    Fixture {
        dir,
        images,
        payload,
        props,
    }
}

fn check_all(ota: &Ota, images: &[Vec<u8>]) {
    let (props, _) = ota.properties().expect("properties");
    let r = props.check_metadata(ota.payload()).unwrap();
    assert_eq!(
        (r.file_size, r.file_hash, r.metadata_size, r.metadata_hash),
        (
            Check::Matched,
            Check::NotChecked,
            Check::Matched,
            Check::Matched
        )
    );
    let mut read = 0;
    assert_eq!(
        props
            .check_file_hash(ota.payload(), &mut |n| read += n)
            .unwrap(),
        Check::Matched
    );
    assert_eq!(read, ota.payload().len());
    let out = extract_to_memory(ota.payload(), None, 2).unwrap();
    for (i, (_, img)) in out.iter().enumerate() {
        assert!(*img == images[i], "partition {i}");
    }
}

#[test]
fn a_zip64_ota_is_read_in_place_with_its_properties() {
    let f = fixture();
    for (filler, method) in [(0, "stored64"), (0, "stored"), (65_536, "stored")] {
        let zip = f.dir.join("ota.zip");
        make_zip(
            &zip,
            filler,
            &[
                ("payload_properties.txt", &f.props, "deflated"),
                ("payload.bin", &f.payload, method),
            ],
        );
        let bytes = std::fs::read(&zip).unwrap();
        if filler > 0 {
            // The archive's own end record is zip64.
            assert!(
                bytes.windows(4).any(|w| w == b"PK\x06\x06"),
                "no zip64 end record"
            );
        }
        let ota = Ota::open(&zip).unwrap();
        let Container::Zip { payload_offset } = ota.container() else {
            panic!("{:?}", ota.container());
        };
        // The payload is read where it lies in the zip.
        let at = payload_offset as usize;
        assert_eq!(&bytes[at..at + 4], b"CrAU");
        assert_eq!(ota.properties().unwrap().1, &PropertiesOrigin::Zip);
        check_all(&ota, &f.images);
    }
}

#[test]
fn a_bare_payload_uses_the_properties_beside_it() {
    let f = fixture();
    let ota = Ota::open(&f.payload).unwrap();
    assert!(ota.properties().is_none(), "no payload_properties.txt yet");
    std::fs::copy(&f.props, f.dir.join("payload_properties.txt")).unwrap();
    let ota = Ota::open(&f.payload).unwrap();
    assert_eq!(ota.container(), Container::Bare);
    assert!(matches!(
        ota.properties().unwrap().1,
        PropertiesOrigin::File { .. }
    ));
    check_all(&ota, &f.images);
}

#[test]
fn properties_that_disagree_are_refused() {
    let f = fixture();
    let good = std::fs::read_to_string(&f.props).unwrap();
    let len = std::fs::metadata(&f.payload).unwrap().len();
    let cases = [
        (
            good.replace(
                &format!("FILE_SIZE={len}"),
                &format!("FILE_SIZE={}", len + 1),
            ),
            "FILE_SIZE",
        ),
        (
            good.replace("METADATA_SIZE=", "METADATA_SIZE=1"),
            "METADATA_SIZE",
        ),
    ];
    for (text, key) in cases {
        let p = Properties::parse(&text).unwrap();
        let pay = Payload::from_bytes(std::fs::read(&f.payload).unwrap()).unwrap();
        let e = p.check_metadata(&pay).unwrap_err();
        assert!(
            matches!(&e, OtaError::PropertiesMismatch { key: k, .. } if *k == key),
            "{e}"
        );
    }
    // Hashes of another payload.
    let other = PayloadBuilder::new()
        .partition("x", &pattern(4096, 5), 1, &[Encoding::Replace])
        .bytes();
    let theirs =
        Properties::parse(&Properties::render(&Payload::from_bytes(other).unwrap()).unwrap())
            .unwrap();
    let mut p = Properties::parse(&good).unwrap();
    p.metadata_hash = theirs.metadata_hash;
    let pay = Payload::from_bytes(std::fs::read(&f.payload).unwrap()).unwrap();
    let e = p.check_metadata(&pay).unwrap_err();
    assert!(
        e.to_string()
            .starts_with("payload_properties.txt: METADATA_HASH is "),
        "{e}"
    );
    let mut p = Properties::parse(&good).unwrap();
    p.file_hash = theirs.file_hash;
    let e = p.check_file_hash(&pay, &mut |_| {}).unwrap_err();
    assert!(
        e.to_string()
            .starts_with("payload_properties.txt: FILE_HASH is "),
        "{e}"
    );
}

#[test]
fn compressed_missing_or_foreign_payloads_are_refused() {
    let f = fixture();
    let zip = f.dir.join("deflated.zip");
    make_zip(&zip, 0, &[("payload.bin", &f.payload, "deflated")]);
    let e = Ota::open(&zip).unwrap_err();
    assert_eq!(
        e.to_string(),
        "payload.bin in the zip is compressed (Deflated); A/B OTAs store it uncompressed so it can be read in place"
    );
    let zip = f.dir.join("nopayload.zip");
    make_zip(&zip, 0, &[("other.bin", &f.payload, "stored")]);
    let e = Ota::open(&zip).unwrap_err();
    assert_eq!(
        e.to_string(),
        "the zip has no payload.bin (not an A/B OTA package)"
    );
    let junk = f.dir.join("junk");
    std::fs::write(&junk, pattern(1000, 2)).unwrap();
    let e = Ota::open(&junk).unwrap_err();
    assert!(matches!(e, OtaError::NotOta), "{e}");
    // A zip cut short: its directory is gone.
    let zip = f.dir.join("ota.zip");
    make_zip(&zip, 0, &[("payload.bin", &f.payload, "stored")]);
    let b = std::fs::read(&zip).unwrap();
    std::fs::write(&zip, &b[..b.len() / 2]).unwrap();
    let e = Ota::open(&zip).unwrap_err();
    assert!(matches!(e, OtaError::Zip(_)), "{e}");
    assert_eq!(e.to_string(), "reading the OTA zip's directory");
}

#[test]
fn a_zip_or_bare_payload_opens_from_any_positional_source() {
    let f = fixture();
    let zip = f.dir.join("ota.zip");
    make_zip(
        &zip,
        0,
        &[
            ("payload_properties.txt", &f.props, "deflated"),
            ("payload.bin", &f.payload, "stored"),
        ],
    );
    let bytes = std::fs::read(&zip).unwrap();
    let ota = Ota::open_reader(std::sync::Arc::new(bytes)).unwrap();
    assert_eq!(ota.container(), Ota::open(&zip).unwrap().container());
    assert_eq!(ota.properties().unwrap().1, &PropertiesOrigin::Zip);
    check_all(&ota, &f.images);
    // A bare payload: no file beside it to take properties from.
    let ota = Ota::open_reader(std::sync::Arc::new(std::fs::read(&f.payload).unwrap())).unwrap();
    assert_eq!(ota.container(), Container::Bare);
    assert!(ota.properties().is_none());
    let out = extract_to_memory(ota.payload(), None, 2).unwrap();
    assert!(out.iter().zip(&f.images).all(|((_, a), b)| a == b));
    assert!(matches!(
        Ota::open_reader(std::sync::Arc::new(b"not an OTA".to_vec())),
        Err(OtaError::NotOta)
    ));
}
