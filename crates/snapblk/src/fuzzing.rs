//! Entry point shared by the cargo-fuzz target (crates/snapblk/fuzz) and the unit test below:
//! parse untrusted text as a device spec and, for the in-memory `null` driver, apply it the way
//! [`crate::open`] does (set every property with the spec's value syntax, connect). Must never
//! panic, whatever the input; touches no file (other drivers are only parsed).

/// Parse `data` as a device spec; open it when it names the `null` driver.
pub fn fuzz_spec(data: &[u8]) {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(spec) = crate::parse_spec(s) else {
        return;
    };
    if spec.driver != "null" {
        return;
    }
    let Ok(mut b) = crate::create("null") else {
        return;
    };
    for (k, v) in &spec.props {
        if crate::set_spec_prop(&mut b, k, v).is_err() {
            return;
        }
    }
    let _ = b.connect();
}

#[cfg(test)]
mod tests {
    #[test]
    fn odd_specs_do_not_panic() {
        for s in [
            "null:size=18446744073709551615",
            "null:size=513",
            "null:size=1G,size=2G",
            "null:=",
            "null:,,,",
            "null:size=99999999999999999999T",
            "null:read-only=maybe",
            "snapshot:base=,cow=",
            ":size=1G",
            "\u{0}:x=y",
        ] {
            super::fuzz_spec(s.as_bytes());
        }
    }
}
