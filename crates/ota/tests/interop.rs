//! Payloads written by this crate's writer, read by an independent third-party dumper (PyPI
//! `payload-dumper` 0.3.0, which handles REPLACE, REPLACE_BZ, REPLACE_XZ and ZERO): it must
//! produce the images the payloads were made from. Ignored in a plain `cargo test` for want of
//! the dumper; tests/suites/ota-interop.sh installs it into a venv and runs this with
//! `--ignored`, the dumper's path in `PAYLOAD_DUMPER`.

use snapblk_ota::testing::{Encoding, PayloadBuilder};
use snapblk_testsupport::{TempDir, path_str, pattern, tool_ok};

#[test]
#[ignore = "needs PyPI payload-dumper: tests/suites/ota-interop.sh"]
fn payload_dumper_reads_our_payloads_to_the_same_images() {
    let dumper = std::env::var("PAYLOAD_DUMPER")
        .expect("PAYLOAD_DUMPER must name the payload_dumper executable");
    let d = TempDir::new("ota-interop");
    // Whole blocks (the dumper writes whole destination blocks), zero runs in the middle and at
    // the end (ZERO ops), every encoding the dumper knows, several chunk sizes.
    let mut system = pattern(64 * 4096, 1);
    system[10 * 4096..20 * 4096].fill(0);
    system[60 * 4096..].fill(0);
    let vendor = pattern(17 * 4096, 2);
    let mut boot = vec![0u8; 8 * 4096];
    boot[..100].copy_from_slice(&pattern(100, 3));
    let images = [("system", system), ("vendor", vendor), ("boot", boot)];
    let encodings = [Encoding::Replace, Encoding::Bz, Encoding::Xz];
    for (chunk, name) in [(1, "small"), (4, "medium"), (32, "large")] {
        let mut b = PayloadBuilder::new();
        for (i, (n, img)) in images.iter().enumerate() {
            let mut enc = encodings.to_vec();
            enc.rotate_left(i);
            b = b.partition(n, img, chunk, &enc);
        }
        let payload = d.join(&format!("{name}.bin"));
        std::fs::write(&payload, b.bytes()).unwrap();
        let out = d.join(name);
        tool_ok(
            &dumper,
            &[
                "--out",
                path_str(&out),
                "--workers",
                "2",
                path_str(&payload),
            ],
        );
        for (n, img) in &images {
            let got = std::fs::read(out.join(format!("{n}.img"))).unwrap();
            assert!(
                got == *img,
                "{name}: payload_dumper's {n}.img differs ({} bytes, want {})",
                got.len(),
                img.len()
            );
        }
    }
}
