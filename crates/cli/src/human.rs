//! Human-readable numbers for text output (`--json` keeps exact integers): the one style of
//! every command's text. Sizes and rates in binary units with two decimals (`bytes`, `rate`);
//! where the exact count matters too (image sizes a user compares or passes on), both
//! (`bytes_exact`: `4.00 MiB (4194304 bytes)`). Counts of blocks, ops and files stay integers.

/// Bytes in binary units with two decimals: `512 B`, `1.50 KiB`, `3.00 GiB`.
pub(crate) fn bytes(b: u64) -> String {
    const U: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut i = 0;
    while v >= 1024.0 && i + 1 < U.len() {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{b} B")
    } else {
        format!("{v:.2} {}", U[i])
    }
}

/// [`bytes`] followed by the exact count when a unit was used: `512 B`,
/// `4.00 MiB (4194304 bytes)`.
pub(crate) fn bytes_exact(b: u64) -> String {
    if b < 1024 {
        bytes(b)
    } else {
        format!("{} ({b} bytes)", bytes(b))
    }
}

/// `b` bytes in `secs` seconds as a rate: `12.50 MiB/s` (`-` for no time at all).
pub(crate) fn rate(b: u64, secs: f64) -> String {
    if secs > 0.0 {
        let per_s = (b as f64 / secs).min(u64::MAX as f64) as u64;
        format!("{}/s", bytes(per_s))
    } else {
        "-".into()
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn exact_and_rate() {
        assert_eq!(super::bytes_exact(512), "512 B");
        assert_eq!(super::bytes_exact(4 << 20), "4.00 MiB (4194304 bytes)");
        assert_eq!(super::rate(25 << 20, 2.0), "12.50 MiB/s");
        assert_eq!(super::rate(100, 0.0), "-");
    }

    #[test]
    fn units() {
        assert_eq!(super::bytes(0), "0 B");
        assert_eq!(super::bytes(1023), "1023 B");
        assert_eq!(super::bytes(1536), "1.50 KiB");
        assert_eq!(super::bytes(3 << 30), "3.00 GiB");
        assert_eq!(super::bytes(u64::MAX), "16777216.00 TiB");
    }
}
