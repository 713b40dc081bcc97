//! AWS Signature Version 4 for S3 requests, written from AWS's specification ("Signature Version 4
//! signing process" and the S3 "Authenticating Requests: Using the Authorization Header"
//! pages): canonical request → string to sign → signing key (an HMAC-SHA256 chain over date,
//! region, service) → signature. Only what a header-signed S3 request needs: the payload hash
//! goes in `x-amz-content-sha256` (RGW refuses a request without it) and is always signed.

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

/// SHA-256 of the empty string, the payload hash of a GET or HEAD.
pub const EMPTY_SHA256: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

/// An access key pair (and session token for temporary credentials).
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    /// `AWS_ACCESS_KEY_ID`.
    pub access_key: String,
    /// `AWS_SECRET_ACCESS_KEY`.
    pub secret_key: String,
    /// `AWS_SESSION_TOKEN`, sent as `x-amz-security-token`.
    pub session_token: Option<String>,
}

impl std::fmt::Debug for Credentials {
    /// The access key id only: secrets never reach a log.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("access_key", &self.access_key)
            .finish_non_exhaustive()
    }
}

/// One request to sign. `headers` are the headers to sign (names in any case); they must
/// include `host` and `x-amz-date`, and the caller sends them all as given.
#[derive(Debug)]
pub struct SignRequest<'a> {
    /// `GET`, `HEAD`, `PUT`, ...
    pub method: &'a str,
    /// The path, already URI-encoded (see [`uri_encode`]).
    pub path: &'a str,
    /// Query parameters, not encoded.
    pub query: &'a [(&'a str, &'a str)],
    /// Headers to sign.
    pub headers: &'a [(&'a str, &'a str)],
    /// Hex SHA-256 of the payload, or `UNSIGNED-PAYLOAD`.
    pub payload_hash: &'a str,
}

/// The request's scope: `YYYYMMDD/REGION/SERVICE/aws4_request` pieces and the timestamp.
#[derive(Debug, Clone, Copy)]
pub struct Scope<'a> {
    /// `YYYYMMDDTHHMMSSZ` (the `x-amz-date` value).
    pub datetime: &'a str,
    /// Region, e.g. `us-east-1`.
    pub region: &'a str,
    /// Service, `s3`.
    pub service: &'a str,
}

/// Percent-encode `s` as SigV4 wants: unreserved characters (`A-Z a-z 0-9 - _ . ~`) stay,
/// every other byte becomes `%XY` (upper-case hex); `/` stays when `keep_slash` (object keys in
/// paths).
pub fn uri_encode(s: &str, keep_slash: bool) -> String {
    let mut out = String::with_capacity(s.len());
    for &b in s.as_bytes() {
        if b.is_ascii_alphanumeric()
            || matches!(b, b'-' | b'_' | b'.' | b'~')
            || (keep_slash && b == b'/')
        {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The canonical request and the `;`-joined signed header names.
pub fn canonical_request(r: &SignRequest<'_>) -> (String, String) {
    let mut q: Vec<(String, String)> = r
        .query
        .iter()
        .map(|(k, v)| (uri_encode(k, false), uri_encode(v, false)))
        .collect();
    q.sort();
    let query = q
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join("&");
    let mut h: Vec<(String, String)> = Vec::with_capacity(r.headers.len());
    for (k, v) in r.headers {
        let name = k.to_ascii_lowercase();
        let value = v.split_whitespace().collect::<Vec<_>>().join(" ");
        match h.iter_mut().find(|(n, _)| *n == name) {
            Some((_, old)) => {
                old.push(',');
                old.push_str(&value);
            }
            None => h.push((name, value)),
        }
    }
    h.sort();
    let canon_headers: String = h.iter().map(|(k, v)| format!("{k}:{v}\n")).collect();
    let signed = h
        .iter()
        .map(|(k, _)| k.as_str())
        .collect::<Vec<_>>()
        .join(";");
    let path = if r.path.is_empty() { "/" } else { r.path };
    let creq = format!(
        "{}\n{}\n{}\n{}\n{}\n{}",
        r.method, path, query, canon_headers, signed, r.payload_hash
    );
    (creq, signed)
}

/// The string to sign for a canonical request.
pub fn string_to_sign(scope: Scope<'_>, creq: &str) -> String {
    format!(
        "AWS4-HMAC-SHA256\n{}\n{}\n{}",
        scope.datetime,
        credential_scope(scope),
        hex(&Sha256::digest(creq.as_bytes()))
    )
}

fn credential_scope(scope: Scope<'_>) -> String {
    let date = scope.datetime.get(..8).unwrap_or(scope.datetime);
    format!("{date}/{}/{}/aws4_request", scope.region, scope.service)
}

fn hmac(key: &[u8], data: &[u8]) -> [u8; 32] {
    // An HMAC key may have any length: new_from_slice cannot fail for HMAC.
    let mut m = <Hmac<Sha256> as Mac>::new_from_slice(key).unwrap_or_else(|_| unreachable!());
    m.update(data);
    m.finalize().into_bytes().into()
}

/// The signing key for a secret, date (`YYYYMMDD`), region and service.
pub fn signing_key(secret: &str, date: &str, region: &str, service: &str) -> [u8; 32] {
    let k_date = hmac(format!("AWS4{secret}").as_bytes(), date.as_bytes());
    let k_region = hmac(&k_date, region.as_bytes());
    let k_service = hmac(&k_region, service.as_bytes());
    hmac(&k_service, b"aws4_request")
}

/// The `Authorization` header value for a request.
pub fn authorization(creds: &Credentials, scope: Scope<'_>, r: &SignRequest<'_>) -> String {
    let (creq, signed) = canonical_request(r);
    let sts = string_to_sign(scope, &creq);
    let date = scope.datetime.get(..8).unwrap_or(scope.datetime);
    let key = signing_key(&creds.secret_key, date, scope.region, scope.service);
    format!(
        "AWS4-HMAC-SHA256 Credential={}/{}, SignedHeaders={}, Signature={}",
        creds.access_key,
        credential_scope(scope),
        signed,
        hex(&hmac(&key, sts.as_bytes()))
    )
}

/// Lower-case hex.
pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Hex SHA-256 of `data`.
pub fn sha256_hex(data: &[u8]) -> String {
    hex(&Sha256::digest(data))
}

/// `YYYYMMDDTHHMMSSZ` for seconds since the Unix epoch (UTC; proleptic Gregorian calendar).
pub fn amz_datetime(unix_secs: u64) -> String {
    let days = (unix_secs / 86_400) as i64;
    let s = unix_secs % 86_400;
    // Civil date from a day count (Howard Hinnant's public-domain algorithm, era = 400 years).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}{m:02}{d:02}T{:02}{:02}{:02}Z",
        s / 3600,
        s / 60 % 60,
        s % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    // The test-suite credentials and scope AWS publishes with its SigV4 examples.
    fn suite_creds() -> Credentials {
        Credentials {
            access_key: "AKIDEXAMPLE".into(),
            secret_key: "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY".into(),
            session_token: None,
        }
    }
    const SUITE: Scope<'static> = Scope {
        datetime: "20150830T123600Z",
        region: "us-east-1",
        service: "service",
    };

    #[test]
    fn signing_key_matches_the_published_derivation_example() {
        // The IAM user guide's example: secret, 20150830, us-east-1, iam.
        let k = signing_key(
            "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY",
            "20150830",
            "us-east-1",
            "iam",
        );
        assert_eq!(
            hex(&k),
            "c4afb1cc5771d871763a393e44b703571b55cc28424d1a5e86da6ed3c154a4b9"
        );
    }

    #[test]
    fn get_vanilla() {
        let r = SignRequest {
            method: "GET",
            path: "/",
            query: &[],
            headers: &[
                ("Host", "example.amazonaws.com"),
                ("X-Amz-Date", "20150830T123600Z"),
            ],
            payload_hash: EMPTY_SHA256,
        };
        let (creq, signed) = canonical_request(&r);
        assert_eq!(
            creq,
            "GET\n/\n\nhost:example.amazonaws.com\nx-amz-date:20150830T123600Z\n\nhost;x-amz-date\n\
             e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert_eq!(signed, "host;x-amz-date");
        assert_eq!(
            string_to_sign(SUITE, &creq),
            "AWS4-HMAC-SHA256\n20150830T123600Z\n20150830/us-east-1/service/aws4_request\n\
             bb579772317eb040ac9ed261061d46c1f17a8133879d6129b6e1c25292927e63"
        );
        assert_eq!(
            authorization(&suite_creds(), SUITE, &r),
            "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, \
             SignedHeaders=host;x-amz-date, \
             Signature=5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31"
        );
    }

    #[test]
    fn get_vanilla_query_order_key_case() {
        // Parameters are sorted by encoded name: Param1 before Param2 whatever order they come in.
        let r = SignRequest {
            method: "GET",
            path: "/",
            query: &[("Param2", "value2"), ("Param1", "value1")],
            headers: &[
                ("Host", "example.amazonaws.com"),
                ("X-Amz-Date", "20150830T123600Z"),
            ],
            payload_hash: EMPTY_SHA256,
        };
        let (creq, _) = canonical_request(&r);
        assert!(
            creq.starts_with("GET\n/\nParam1=value1&Param2=value2\n"),
            "{creq}"
        );
        assert!(authorization(&suite_creds(), SUITE, &r).ends_with(
            "Signature=b97d918cfa904a5beff61c982a1b6f458b799221646efd99d3219ec94cdf2500"
        ));
    }

    #[test]
    fn s3_get_object_with_range() {
        // The S3 guide's header-signing example: GET /test.txt with a Range header.
        let creds = Credentials {
            access_key: "AKIAIOSFODNN7EXAMPLE".into(),
            secret_key: "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY".into(),
            session_token: None,
        };
        let scope = Scope {
            datetime: "20130524T000000Z",
            region: "us-east-1",
            service: "s3",
        };
        let r = SignRequest {
            method: "GET",
            path: "/test.txt",
            query: &[],
            headers: &[
                ("Host", "examplebucket.s3.amazonaws.com"),
                ("Range", "bytes=0-9"),
                ("x-amz-content-sha256", EMPTY_SHA256),
                ("x-amz-date", "20130524T000000Z"),
            ],
            payload_hash: EMPTY_SHA256,
        };
        assert_eq!(
            authorization(&creds, scope, &r),
            "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request, \
             SignedHeaders=host;range;x-amz-content-sha256;x-amz-date, \
             Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41"
        );
    }

    #[test]
    fn header_values_are_trimmed_and_spaces_collapsed() {
        let r = SignRequest {
            method: "GET",
            path: "/",
            query: &[],
            headers: &[("My-Header1", "  value1   a  b "), ("Host", "h")],
            payload_hash: EMPTY_SHA256,
        };
        let (creq, signed) = canonical_request(&r);
        assert!(creq.contains("host:h\nmy-header1:value1 a b\n"), "{creq}");
        assert_eq!(signed, "host;my-header1");
    }

    #[test]
    fn uri_encoding() {
        assert_eq!(uri_encode("a b/c~d*é", true), "a%20b/c~d%2A%C3%A9");
        assert_eq!(uri_encode("a/b", false), "a%2Fb");
    }

    #[test]
    fn datetime() {
        assert_eq!(amz_datetime(0), "19700101T000000Z");
        assert_eq!(amz_datetime(1_440_938_160), "20150830T123600Z");
        assert_eq!(amz_datetime(951_782_400), "20000229T000000Z");
    }
}
