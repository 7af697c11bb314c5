//! A `tern serve` child process for end-to-end tests: started on a free port
//! (read back from its "listening on" line), answered over raw HTTP/1.1,
//! killed on drop.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;

/// A running `tern serve`.
pub struct Server {
    /// The process (its pid is what a kill test kills).
    pub child: Child,
    /// The port it bound.
    pub port: u16,
    /// The bearer key requests carry, when it was started with one.
    pub key: Option<String>,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    /// Serves `model` on a free port with `extra` flags; returns once the
    /// model has loaded. `key` is the API key requests present (the caller
    /// passes the matching `--api-key-file` in `extra`).
    pub fn start(model: &Path, key: Option<&str>, extra: &[&str]) -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_tern"))
            .args(["serve", "-m", &model.display().to_string(), "--port", "0"])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start tern serve");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut port = None;
        for line in lines.by_ref() {
            let line = line.unwrap();
            if let Some(rest) = line.split("listening on http://").nth(1) {
                let addr = rest.split_whitespace().next().unwrap();
                port = addr.rsplit(':').next().and_then(|p| p.parse().ok());
            }
            if line.contains("ready in") {
                break;
            }
        }
        // Keep draining stdout so the server never blocks on it.
        std::thread::spawn(move || for _ in lines {});
        Server {
            child,
            port: port.expect("tern serve printed its address"),
            key: key.map(str::to_string),
        }
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// One HTTP/1.1 request; the status and the body as JSON (or a string).
    pub fn request(&self, method: &str, path: &str, body: Option<&Value>) -> (u16, Value) {
        let mut stream = TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(120)))
            .unwrap();
        let body = body.map(Value::to_string).unwrap_or_default();
        let auth = self
            .key
            .as_deref()
            .map(|k| format!("Authorization: Bearer {k}\r\n"))
            .unwrap_or_default();
        write!(
            stream,
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\n{auth}\
             Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            self.port,
            body.len()
        )
        .unwrap();
        let mut raw = Vec::new();
        stream.read_to_end(&mut raw).unwrap();
        let text = String::from_utf8_lossy(&raw);
        let status = text
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        let payload = text.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or("");
        let value = serde_json::from_str(payload).unwrap_or_else(|_| Value::String(payload.into()));
        (status, value)
    }
}
