//! Mutated PUFFDIFF patches through both appliers: ours and the crates.io puffin port
//! (`puffdiff`). The inner patch is BSDF2 with uncompressed streams, so most mutations of its
//! bytes change the patched puff stream itself and reach the huffers. Ours must never panic;
//! wherever both accept a patch they must write the same bytes. Ours refuses more (seen when
//! this was written: a re-encoded deflate of the right bytes but not the right bits, which
//! puffin checks in bytes; literals without a code, which puffin writes as no bits; codes
//! zlib's rules refuse; puff extents that are not whole bytes or not where the layout puts
//! them). A file of its own: the panic hook that keeps the crate's panics quiet is
//! process-wide.

use snapblk_ota::apply_puffdiff;
use snapblk_ota::puffin_testing::{Container, Layout, deflates_in, make_puffdiff};
use snapblk_testsupport::{TempDir, path_str, tool_ok};

const DATA_PY: &str = r#"
import sys, random, zlib
r = random.Random(11)
w = b"alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()
t = b" ".join(r.choice(w) for _ in range(4000))
t2 = t.replace(b"beta gamma", b"gamma beta").replace(b"iota", b"IOTA", 40)
for name, data in (("a", t), ("b", t2)):
    c = zlib.compressobj(6, zlib.DEFLATED, -15)
    open(sys.argv[1] + "/" + name, "wb").write(c.compress(data) + c.flush())
"#;

fn xorshift(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

#[test]
fn mutated_patches_agree_where_both_appliers_accept_them() {
    let dir = TempDir::new("puffin-mut");
    tool_ok("python3", &["-c", DATA_PY, path_str(dir.path())]);
    let a = std::fs::read(dir.join("a")).unwrap();
    let b = std::fs::read(dir.join("b")).unwrap();
    let la = Layout::of(&a, deflates_in(&a, Container::Raw).unwrap()).unwrap();
    let lb = Layout::of(&b, deflates_in(&b, Container::Raw).unwrap()).unwrap();
    let p = make_puffdiff(&a, &la, &b, &lb, |o, n| {
        use bsdiff_android::CompressionAlgorithm::None as Raw;
        let mut v = Vec::new();
        bsdiff_android::diff_bsdf2(o, n, &mut v, Raw, Raw, Raw).unwrap();
        v
    })
    .unwrap();
    let ours = |q: &[u8]| {
        apply_puffdiff(&a, q, b.len() as u64, |old, inner, _, new| {
            bsdiff_android::patch_bsdf2(old, inner, new)
        })
    };
    assert_eq!(ours(&p).unwrap(), b);
    assert_eq!(puffdiff::puffpatch(&a, &p).unwrap(), b);
    // Header bytes, and the inner patch after its 32-byte header and the control stream.
    let header_end = 8 + u32::from_be_bytes(p[4..8].try_into().unwrap()) as usize;
    let control = i64::from_le_bytes(p[header_end + 8..header_end + 16].try_into().unwrap());
    let data_start = header_end + 32 + control as usize;

    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let (mut x, mut both, mut changed, mut only_theirs, mut their_panics) = (0x5eedu64, 0, 0, 0, 0);
    for i in 0..1500 {
        let mut q = p.clone();
        for _ in 0..1 + xorshift(&mut x) % 3 {
            let r = xorshift(&mut x) as usize;
            let at = if i % 8 == 0 {
                4 + r % (header_end - 4)
            } else {
                data_start + r % (q.len() - data_start)
            };
            q[at] ^= 1 << ((r >> 40) % 8);
        }
        let mine = ours(&q);
        match std::panic::catch_unwind(|| puffdiff::puffpatch(&a, &q)) {
            Err(_) => their_panics += 1,
            Ok(Ok(t)) => match mine {
                Ok(m) => {
                    assert!(m == t, "mutation {i}: the appliers disagree");
                    both += 1;
                    changed += usize::from(m != b);
                }
                Err(_) => only_theirs += 1,
            },
            Ok(Err(_)) => {}
        }
    }
    std::panic::set_hook(hook);
    eprintln!(
        "both accepted {both} ({changed} with other bytes than the destination), only the \
         crate {only_theirs}, the crate panicked {their_panics} times"
    );
    assert!(
        changed >= 100,
        "too few mutations reached both huffers: {changed}"
    );
}
