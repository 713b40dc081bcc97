//! Reed–Solomon parity over GF(2^8), the code Android's libfec uses for dm-verity FEC:
//! field polynomial x^8 + x^4 + x^3 + x^2 + 1 (0x11d), generator roots α^0 … α^(roots−1)
//! (first consecutive root 0, primitive element 1), codewords of 255 symbols of which `roots`
//! are parity. The parity of a message m(x) is the remainder of m(x)·x^roots divided by the
//! generator polynomial, written highest degree first after the message (a systematic code):
//! the same bytes as libfec's `encode_rs_char(init_rs_char(8, 0x11d, 0, 1, roots, 0), ...)`.
//!
//! The encoder is a shift register fed one message symbol at a time; [`Rs::feed`] advances many
//! independent codewords by one symbol each, which is how the FEC is computed a block at a time
//! without transposing the data (each byte position of a block is its own codeword).

/// The field polynomial, with the x^8 term.
const POLY: u16 = 0x11d;

/// Powers of α (= 2): `EXP[i]` = α^i for i in 0..255, repeated so that `EXP[a + b]` needs no
/// reduction modulo 255 for a, b < 255.
const EXP: [u8; 512] = {
    let mut t = [0u8; 512];
    let mut x: u16 = 1;
    let mut i = 0;
    while i < 255 {
        t[i] = x as u8;
        t[i + 255] = x as u8;
        x <<= 1;
        if x & 0x100 != 0 {
            x ^= POLY;
        }
        i += 1;
    }
    t
};

/// Discrete logarithms: `LOG[EXP[i]]` = i; `LOG[0]` is unused.
const LOG: [u8; 256] = {
    let mut t = [0u8; 256];
    let mut i = 0;
    while i < 255 {
        t[EXP[i] as usize] = i as u8;
        i += 1;
    }
    t
};

/// Product in GF(2^8).
pub(crate) fn mul(a: u8, b: u8) -> u8 {
    if a == 0 || b == 0 {
        0
    } else {
        EXP[LOG[a as usize] as usize + LOG[b as usize] as usize]
    }
}

/// α^i.
pub(crate) fn alpha_pow(i: usize) -> u8 {
    EXP[i % 255]
}

/// A Reed–Solomon encoder with `roots` parity symbols per codeword.
pub(crate) struct Rs {
    roots: usize,
    /// `mul[t][x]` = x · g_(roots−1−t), where g(x) = x^roots + Σ g_k x^k is the generator:
    /// the feedback term that enters register cell t (cell 0 holds the highest degree).
    mul: Vec<[u8; 256]>,
}

impl Rs {
    /// An encoder with `roots` parity symbols (1..=254; FEC uses 2..=24).
    pub(crate) fn new(roots: usize) -> Rs {
        let roots = roots.clamp(1, 254);
        // g(x) = Π_{i<roots} (x − α^i), coefficients lowest degree first.
        let mut g = vec![0u8; roots + 1];
        g[0] = 1;
        for i in 0..roots {
            let root = alpha_pow(i);
            // Multiply by (x + root): shift up, add root × the old polynomial.
            for k in (0..=i + 1).rev() {
                let shifted = if k > 0 { g[k - 1] } else { 0 };
                g[k] = shifted ^ mul(g[k], root);
            }
        }
        let mul = (0..roots)
            .map(|t| {
                let coef = g[roots - 1 - t];
                let mut row = [0u8; 256];
                for (x, r) in row.iter_mut().enumerate() {
                    *r = self::mul(x as u8, coef);
                }
                row
            })
            .collect();
        Rs { roots, mul }
    }

    /// Parity symbols per codeword.
    pub(crate) fn roots(&self) -> usize {
        self.roots
    }

    /// Advance `data.len()` codewords by one message symbol each: codeword p takes `data[p]`
    /// and keeps its register in `parity[p * roots .. (p + 1) * roots]` (zeros at the start;
    /// after the last symbol it holds the parity, highest degree first).
    pub(crate) fn feed(&self, data: &[u8], parity: &mut [u8]) {
        let r = self.roots;
        debug_assert_eq!(parity.len(), data.len() * r);
        if r == 2 {
            // The default: two cells, two table look-ups per symbol.
            let (m0, m1) = (&self.mul[0], &self.mul[1]);
            for (&d, p) in data.iter().zip(parity.chunks_exact_mut(2)) {
                let fb = (d ^ p[0]) as usize;
                p[0] = p[1] ^ m0[fb];
                p[1] = m1[fb];
            }
            return;
        }
        for (&d, p) in data.iter().zip(parity.chunks_exact_mut(r)) {
            let fb = (d ^ p[0]) as usize;
            for t in 0..r - 1 {
                p[t] = p[t + 1] ^ self.mul[t][fb];
            }
            p[r - 1] = self.mul[r - 1][fb];
        }
    }

    /// The parity of one message (at most 255 − roots symbols), highest degree first.
    #[cfg(test)]
    pub(crate) fn encode(&self, message: &[u8]) -> Vec<u8> {
        let mut parity = vec![0u8; self.roots];
        for &d in message {
            self.feed(&[d], &mut parity);
        }
        parity
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// GF(2^8) product by shift and add, reducing by 0x11d: independent of the tables.
    fn slow_mul(mut a: u8, mut b: u8) -> u8 {
        let mut p = 0u8;
        while b != 0 {
            if b & 1 != 0 {
                p ^= a;
            }
            let carry = a & 0x80 != 0;
            a <<= 1;
            if carry {
                a ^= (POLY & 0xff) as u8;
            }
            b >>= 1;
        }
        p
    }

    /// Parity by long division of m(x)·x^r by the generator, polynomials as arrays highest
    /// degree first, the generator built from its roots by repeated multiplication with
    /// `slow_mul`.
    fn reference_parity(message: &[u8], roots: usize) -> Vec<u8> {
        // g, highest degree first.
        let mut g = vec![1u8];
        let mut root = 1u8;
        for _ in 0..roots {
            let mut next = vec![0u8; g.len() + 1];
            for (i, &c) in g.iter().enumerate() {
                next[i] ^= c;
                next[i + 1] ^= slow_mul(c, root);
            }
            g = next;
            root = slow_mul(root, 2);
        }
        let mut rem: Vec<u8> = message.to_vec();
        rem.extend(std::iter::repeat_n(0, roots));
        for i in 0..message.len() {
            let c = rem[i];
            if c != 0 {
                for (k, &gk) in g.iter().enumerate() {
                    rem[i + k] ^= slow_mul(c, gk);
                }
            }
        }
        rem[message.len()..].to_vec()
    }

    /// The codeword evaluated at α^i.
    fn syndrome(codeword: &[u8], i: usize) -> u8 {
        let x = alpha_pow(i);
        codeword.iter().fold(0u8, |acc, &c| slow_mul(acc, x) ^ c)
    }

    fn message(len: usize, seed: u64) -> Vec<u8> {
        snapblk_testsupport::pattern(len, seed)
    }

    #[test]
    fn tables_agree_with_shift_and_add() {
        for a in 0..=255u8 {
            for b in 0..=255u8 {
                assert_eq!(mul(a, b), slow_mul(a, b), "{a} * {b}");
            }
        }
        // α has order 255: its powers are all non-zero elements.
        let mut seen: Vec<u8> = (0..255).map(alpha_pow).collect();
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen.len(), 255);
        assert!(!seen.contains(&0));
    }

    #[test]
    fn parity_matches_long_division_for_every_fec_root_count() {
        for roots in 1..=24 {
            let rs = Rs::new(roots);
            for (len, seed) in [(255 - roots, 1), (1, 2), (100, 3), (255 - roots, 4)] {
                let m = message(len, seed + roots as u64 * 10);
                assert_eq!(
                    rs.encode(&m),
                    reference_parity(&m, roots),
                    "roots {roots}, len {len}"
                );
            }
        }
    }

    #[test]
    fn codewords_vanish_at_the_generator_roots() {
        for roots in [2, 3, 8, 16, 24] {
            let rs = Rs::new(roots);
            let m = message(255 - roots, 7);
            let mut cw = m.clone();
            cw.extend(rs.encode(&m));
            for i in 0..roots {
                assert_eq!(syndrome(&cw, i), 0, "roots {roots}: S_{i}");
            }
            // One flipped symbol is seen.
            cw[17] ^= 0x40;
            assert!((0..roots).any(|i| syndrome(&cw, i) != 0));
        }
    }

    #[test]
    fn feed_advances_columns_independently() {
        let roots = 3;
        let rs = Rs::new(roots);
        let msgs: Vec<Vec<u8>> = (0..5).map(|s| message(40, s)).collect();
        let mut parity = vec![0u8; msgs.len() * roots];
        for k in 0..40 {
            let column: Vec<u8> = msgs.iter().map(|m| m[k]).collect();
            rs.feed(&column, &mut parity);
        }
        for (p, m) in msgs.iter().enumerate() {
            assert_eq!(parity[p * roots..(p + 1) * roots], rs.encode(m)[..]);
        }
    }

    /// Parity computed by PyPI `reedsolo` 1.7.0 (`RSCodec(nsym, nsize=255, fcr=0,
    /// prim=0x11d, generator=2)`), frozen here so that every `cargo test` checks against an
    /// independent implementation; `reedsolo_agrees_on_random_messages` (run by
    /// tests/suites/ota-interop.sh) compares live.
    #[test]
    fn parity_matches_reedsolo_vectors() {
        let cases: [(usize, &[u8], &[u8]); 4] = [
            (2, b"snapblk", &[0x33, 0x5a]),
            (2, &[0u8; 253], &[0, 0]),
            (4, b"123456789", &[0x65, 0x67, 0xc5, 0xf6]),
            (
                24,
                b"dm-verity FEC",
                &[
                    0xde, 0xe8, 0x59, 0xe6, 0x9d, 0x94, 0x97, 0x0d, 0xc3, 0x9d, 0xbe, 0x6d, 0x03,
                    0xe6, 0x69, 0xc3, 0x7a, 0xe5, 0xe9, 0x89, 0xd3, 0x21, 0x5d, 0xc9,
                ],
            ),
        ];
        for (roots, msg, want) in cases {
            assert_eq!(Rs::new(roots).encode(msg), want, "roots {roots}, {msg:?}");
        }
    }

    /// Compares with Phil Karn's libfec (Debian's `libfec-dev`), whose `init_rs_char` /
    /// `encode_rs_char` update_engine and libfec call with these parameters
    /// (`init_rs_char(8, 0x11d, 0, 1, roots, pad)`): a C program built with `cc` prints the
    /// parity of random messages for every roots count from 2 to 24.
    #[test]
    fn karns_libfec_agrees_on_random_messages() {
        let dir = snapblk_testsupport::TempDir::new("ota-libfec");
        let src = dir.join("rs.c");
        std::fs::write(
            &src,
            r#"#include <fec.h>
#include <stdio.h>
#include <string.h>
/* Lines of "ROOTS HEXMESSAGE" in, lines of hex parity out. */
int main(void) {
    int roots; char hex[1024];
    while (scanf("%d %1023s", &roots, hex) == 2) {
        unsigned char msg[255], parity[255];
        int len = (int)strlen(hex) / 2;
        for (int i = 0; i < len; i++) sscanf(hex + 2 * i, "%2hhx", &msg[i]);
        void *rs = init_rs_char(8, 0x11d, 0, 1, roots, 255 - roots - len);
        if (!rs) return 2;
        encode_rs_char(rs, msg, parity);
        free_rs_char(rs);
        for (int i = 0; i < roots; i++) printf("%02x", parity[i]);
        printf("\n");
    }
    return 0;
}
"#,
        )
        .unwrap();
        let exe = dir.join("rs");
        snapblk_testsupport::tool_ok(
            "cc",
            &[
                "-O1",
                "-o",
                snapblk_testsupport::path_str(&exe),
                snapblk_testsupport::path_str(&src),
                "-lfec",
            ],
        );
        let mut cases = Vec::new();
        for roots in 2..=24usize {
            for (len, seed) in [(255 - roots, 11u64), (1, 12), (100, 13)] {
                cases.push((roots, message(len, seed * 1000 + roots as u64)));
            }
        }
        let lines = run_with_input(
            std::process::Command::new(&exe),
            &cases
                .iter()
                .map(|(r, m)| format!("{r} {}\n", crate::hex(m)))
                .collect::<String>(),
        );
        assert_eq!(lines.len(), cases.len());
        for ((roots, m), want) in cases.iter().zip(&lines) {
            assert_eq!(
                &crate::hex(&Rs::new(*roots).encode(m)),
                want,
                "roots {roots}, message of {} bytes",
                m.len()
            );
        }
    }

    /// Run `cmd` with `input` on its stdin; its stdout lines (it must succeed).
    fn run_with_input(mut cmd: std::process::Command, input: &str) -> Vec<String> {
        use std::io::Write;
        let mut child = cmd
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("run the reference");
        child
            .stdin
            .take()
            .unwrap()
            .write_all(input.as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "the reference failed: {:?}",
            out.status
        );
        String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .map(str::to_owned)
            .collect()
    }

    /// Compares with PyPI `reedsolo` live: `REEDSOLO_PYTHON` names a Python with it installed.
    #[test]
    #[ignore = "needs PyPI reedsolo: tests/suites/ota-interop.sh"]
    fn reedsolo_agrees_on_random_messages() {
        let python = std::env::var("REEDSOLO_PYTHON")
            .expect("REEDSOLO_PYTHON must name a python with reedsolo installed");
        let mut cases = Vec::new();
        for roots in 2..=24usize {
            for (len, seed) in [(255 - roots, 1u64), (1, 2), (77, 3)] {
                cases.push((roots, message(len, seed * 1000 + roots as u64)));
            }
        }
        let input: String = cases
            .iter()
            .map(|(r, m)| format!("{r} {}\n", crate::hex(m)))
            .collect();
        let script = "import sys, reedsolo\n\
            for line in sys.stdin:\n\
            \x20   r, m = line.split()\n\
            \x20   c = reedsolo.RSCodec(int(r), nsize=255, fcr=0, prim=0x11d, generator=2, c_exp=8)\n\
            \x20   print(bytes(c.encode(bytes.fromhex(m))[-int(r):]).hex())\n";
        let mut cmd = std::process::Command::new(&python);
        cmd.args(["-c", script]);
        let lines = run_with_input(cmd, &input);
        assert_eq!(lines.len(), cases.len());
        for ((roots, m), want) in cases.iter().zip(&lines) {
            assert_eq!(
                &crate::hex(&Rs::new(*roots).encode(m)),
                want,
                "roots {roots}, message of {} bytes",
                m.len()
            );
        }
    }
}
