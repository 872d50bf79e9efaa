//! A minimal blocking HTTP/1.1 client over `TcpStream`, for the tests and `bench_serve`: they talk
//! to the server byte for byte (status, headers, chunked bodies, server-sent events,
//! newline-delimited JSON), so what they check is what goes over the wire, with no client library
//! in between.

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// A response: status, headers (lower-case names), body (de-chunked).
#[derive(Clone, Debug)]
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Reply {
    /// The body as JSON (panics with the body if it is not: for tests).
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&self.body)))
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The body's lines as JSON values (newline-delimited JSON, as Ollama streams; panics with
    /// the line if one is not JSON: for tests).
    pub fn ndjson(&self) -> Vec<serde_json::Value> {
        String::from_utf8_lossy(&self.body)
            .lines()
            .filter(|l| !l.is_empty())
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .collect()
    }

    /// The server-sent events' `data:` payloads.
    pub fn events(&self) -> Vec<String> {
        String::from_utf8_lossy(&self.body)
            .lines()
            .filter_map(|l| l.strip_prefix("data: ").map(str::to_string))
            .collect()
    }
}

/// Sends one request (`Connection: close`) and reads the whole reply.
pub fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    api_key: Option<&str>,
    body: &[u8],
) -> std::io::Result<Reply> {
    let stream = send(addr, method, path, api_key, body)?;
    read_reply(BufReader::new(stream))
}

/// Sends one request and returns the connection, for reading a stream as it comes.
pub fn send(
    addr: SocketAddr,
    method: &str,
    path: &str,
    api_key: Option<&str>,
    body: &[u8],
) -> std::io::Result<TcpStream> {
    let mut s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(300)))?;
    let auth = api_key.map_or(String::new(), |k| format!("Authorization: Bearer {k}\r\n"));
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )?;
    s.write_all(body)?;
    Ok(s)
}

fn bad(what: &str) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_string())
}

/// Reads a reply: the status line, the headers, then the body (chunked or to the end).
pub fn read_reply(mut r: impl BufRead) -> std::io::Result<Reply> {
    let mut line = String::new();
    r.read_line(&mut line)?;
    let status: u16 = line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| bad("no status line"))?;
    let mut headers = Vec::new();
    loop {
        line.clear();
        r.read_line(&mut line)?;
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        let (n, v) = l.split_once(':').ok_or_else(|| bad("bad header"))?;
        headers.push((n.to_ascii_lowercase(), v.trim().to_string()));
    }
    let chunked = headers
        .iter()
        .any(|(n, v)| n == "transfer-encoding" && v.contains("chunked"));
    let mut body = Vec::new();
    if chunked {
        loop {
            line.clear();
            r.read_line(&mut line)?;
            let n = usize::from_str_radix(line.trim(), 16).map_err(|_| bad("bad chunk size"))?;
            if n == 0 {
                break;
            }
            let mut chunk = vec![0; n + 2];
            r.read_exact(&mut chunk)?;
            body.extend_from_slice(&chunk[..n]);
        }
    } else {
        r.read_to_end(&mut body)?;
    }
    Ok(Reply {
        status,
        headers,
        body,
    })
}
