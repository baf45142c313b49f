//! One request head, sans I/O: parsed by `httparse` from a buffer that never grows past
//! [`HEAD_LIMIT`], so a peer that sends a header line without end costs 8 KiB, not memory.

/// The most bytes a request head (request line and headers) may take.
pub const HEAD_LIMIT: usize = 8 << 10;
/// The most header lines a request may carry.
const MAX_HEADERS: usize = 32;

/// What a request asks for, as far as `serve` cares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Head {
    /// GET or HEAD; anything else is answered 405.
    pub method: Method,
    /// The path without its query.
    pub path: String,
    /// The bearer token sent, if any.
    pub bearer: Option<String>,
    /// The `Accept` header.
    pub accept: Option<String>,
    /// The client wants the connection closed after this answer (or speaks HTTP/1.0).
    pub close: bool,
    /// The request carries a body (`serve` takes none).
    pub has_body: bool,
}

/// Request methods `serve` tells apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    /// GET.
    Get,
    /// HEAD: the answer without its body.
    Head,
    /// Anything else.
    Other,
}

/// The outcome of looking at the bytes read so far.
#[derive(Debug, PartialEq, Eq)]
pub enum Parsed {
    /// More bytes are needed (and may still fit).
    Partial,
    /// A whole head of `len` bytes.
    Complete {
        /// The request.
        head: Head,
        /// Bytes it took (what follows is the next pipelined request).
        len: usize,
    },
    /// Not a request `serve` will read: answer with this status and close.
    Invalid(u16, &'static str),
}

/// Parse the head at the start of `buf`.
pub fn parse(buf: &[u8]) -> Parsed {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut request = httparse::Request::new(&mut headers);
    let len = match request.parse(buf) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) if buf.len() >= HEAD_LIMIT => {
            return Parsed::Invalid(431, "the request head is over 8 KiB")
        }
        Ok(httparse::Status::Partial) => return Parsed::Partial,
        Err(httparse::Error::TooManyHeaders) => return Parsed::Invalid(431, "over 32 header lines"),
        Err(_) => return Parsed::Invalid(400, "not an HTTP/1.x request"),
    };
    if len > HEAD_LIMIT {
        return Parsed::Invalid(431, "the request head is over 8 KiB");
    }
    let method = match request.method {
        Some("GET") => Method::Get,
        Some("HEAD") => Method::Head,
        _ => Method::Other,
    };
    let header = |name: &str| {
        request
            .headers
            .iter()
            .find(|h| h.name.eq_ignore_ascii_case(name))
            .map(|h| String::from_utf8_lossy(h.value).trim().to_string())
    };
    let connection = header("Connection").unwrap_or_default().to_ascii_lowercase();
    let http10 = request.version == Some(0);
    let close = connection.contains("close") || (http10 && !connection.contains("keep-alive"));
    let has_body = header("Transfer-Encoding").is_some()
        || header("Content-Length").is_some_and(|l| l.parse::<u64>().map_or(true, |n| n > 0));
    let bearer = header("Authorization").and_then(|a| a.strip_prefix("Bearer ").map(|t| t.trim().to_string()));
    let path = request.path.unwrap_or("").split('?').next().unwrap_or("").to_string();
    Parsed::Complete { head: Head { method, path, bearer, accept: header("Accept"), close, has_body }, len }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(text: &str) -> Head {
        match parse(text.as_bytes()) {
            Parsed::Complete { head, len } => {
                assert_eq!(len, text.len());
                head
            }
            other => panic!("{text:?}: {other:?}"),
        }
    }

    #[test]
    fn a_scrape_request_is_read_with_its_token_format_and_keep_alive() {
        let h = head(
            "GET /metrics?x=1 HTTP/1.1\r\nHost: a\r\nauthorization: Bearer  s3cret \r\n\
             Accept: application/openmetrics-text\r\n\r\n",
        );
        assert_eq!(h.method, Method::Get);
        assert_eq!(h.path, "/metrics");
        assert_eq!(h.bearer.as_deref(), Some("s3cret"));
        assert!(h.accept.unwrap().contains("openmetrics"));
        assert!(!h.close && !h.has_body);
        assert!(head("GET / HTTP/1.0\r\n\r\n").close, "HTTP/1.0 closes by default");
        assert!(!head("GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n").close);
        assert!(head("HEAD / HTTP/1.1\r\nConnection: Close\r\n\r\n").close);
        assert!(head("POST / HTTP/1.1\r\nContent-Length: 5\r\n\r\n").has_body);
        assert!(head("GET / HTTP/1.1\r\nContent-Length: x\r\n\r\n").has_body, "an unreadable length is a body");
        assert!(head("GET / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n").has_body);
        assert_eq!(head("DELETE / HTTP/1.1\r\n\r\n").method, Method::Other);
    }

    #[test]
    fn a_head_without_end_stops_at_the_limit_and_garbage_is_refused() {
        assert_eq!(parse(b"GET /metrics HTTP/1.1\r\nX: "), Parsed::Partial);
        let endless = [b"GET / HTTP/1.1\r\nX: ".as_slice(), &vec![b'a'; HEAD_LIMIT]].concat();
        assert_eq!(parse(&endless), Parsed::Invalid(431, "the request head is over 8 KiB"));
        let many = format!("GET / HTTP/1.1\r\n{}\r\n", "A: b\r\n".repeat(40));
        assert!(matches!(parse(many.as_bytes()), Parsed::Invalid(431, _)));
        assert!(matches!(parse(b"\x16\x03\x01\x02\x00garbage\r\n\r\n"), Parsed::Invalid(400, _)));
    }

    #[test]
    fn pipelined_requests_are_taken_one_head_at_a_time() {
        let two = b"GET /a HTTP/1.1\r\n\r\nGET /b HTTP/1.1\r\n\r\n";
        let Parsed::Complete { head, len } = parse(two) else { panic!() };
        assert_eq!(head.path, "/a");
        let Parsed::Complete { head, .. } = parse(&two[len..]) else { panic!() };
        assert_eq!(head.path, "/b");
    }

    /// Mutation fuzzing of the parser (issue 23's fuzzing, extended): any bytes give a value,
    /// never a panic, and never more than the limit is asked for. `VIRTPROF_FUZZ_ITERS`
    /// inputs (default 20 000; `benches/fuzz.sh` runs a million).
    #[test]
    fn fuzz_request_heads() {
        let iters = virtprof_host::fuzz::iterations(20_000);
        let seeds: [&[u8]; 3] = [
            b"GET /metrics HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer abcdefgh\r\nAccept: application/openmetrics-text\r\n\r\n",
            b"HEAD / HTTP/1.0\r\nConnection: keep-alive\r\nContent-Length: 0\r\n\r\nGET / HTTP/1.1\r\n\r\n",
            b"POST /x?y HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        ];
        let mut rng = virtprof_host::fuzz::Rng(0x9e37_79b9_7f4a_7c15);
        for i in 0..iters {
            let mut input = seeds[i % seeds.len()].to_vec();
            for _ in 0..=rng.below(8) {
                let at = rng.below(input.len() + 1);
                match rng.below(4) {
                    0 if at < input.len() => input[at] = rng.byte(),
                    1 => input.insert(at, rng.byte()),
                    2 if at < input.len() => drop(input.remove(at)),
                    _ => input.extend(std::iter::repeat_n(b'a', rng.below(4096))),
                }
            }
            if let Parsed::Complete { len, .. } = parse(&input) {
                assert!(len <= input.len().min(HEAD_LIMIT), "input {i}");
            }
        }
    }
}
