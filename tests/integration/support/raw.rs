//! A raw RESP client for tests that need exact bytes: pipelines written in one go, replies read one
//! frame at a time, malformed input, and hanging up mid-command.

use std::path::Path;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;
use tollgate_resp::{Frame, Limits};

pub struct RawClient {
    stream: UnixStream,
    buffer: BytesMut,
}

impl RawClient {
    pub async fn connect(socket: &Path) -> RawClient {
        RawClient {
            stream: UnixStream::connect(socket)
                .await
                .expect("connect to RESP socket"),
            buffer: BytesMut::new(),
        }
    }

    /// A connection straight to a test's redis-server (`socket`), logged in as testkit's admin
    /// (Redis's `default` user is off there).
    pub async fn to_redis(socket: &Path) -> RawClient {
        let mut client = RawClient::connect(socket).await;
        let password = tollgate_testkit::admin_password();
        let reply = client
            .call(&["AUTH", tollgate_testkit::ADMIN_USER, password])
            .await;
        assert_eq!(reply, Frame::Simple("OK".into()), "testkit admin's AUTH");
        client
    }

    pub fn from_stream(stream: UnixStream) -> RawClient {
        RawClient {
            stream,
            buffer: BytesMut::new(),
        }
    }

    /// The connection itself, for a test that stops reading it; nothing may be left unread.
    pub fn into_stream(self) -> UnixStream {
        assert!(self.buffer.is_empty(), "unread bytes");
        self.stream
    }

    /// Writes raw bytes as they are.
    pub async fn write(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).await.expect("write");
    }

    /// Writes several commands in one write (a pipeline).
    pub async fn pipeline(&mut self, commands: &[&[&str]]) {
        let mut out = BytesMut::new();
        for argv in commands {
            tollgate_resp::encode_command(argv, &mut out);
        }
        self.write(&out).await;
    }

    pub async fn send(&mut self, argv: &[&str]) {
        self.pipeline(&[argv]).await;
    }

    /// Sends one command and reads its reply.
    pub async fn call(&mut self, argv: &[&str]) -> Frame {
        self.send(argv).await;
        self.read().await
    }

    /// The next reply; panics after 10 s or if the server closes first.
    pub async fn read(&mut self) -> Frame {
        self.read_within(Duration::from_secs(10))
            .await
            .expect("a reply in time")
            .expect("connection still open")
    }

    /// `Err` on timeout, `Ok(None)` when the server closed the connection.
    pub async fn read_within(&mut self, limit: Duration) -> Result<Option<Frame>, ()> {
        tokio::time::timeout(limit, async {
            loop {
                if let Some(frame) =
                    tollgate_resp::parse(&mut self.buffer, &Limits::default()).expect("valid RESP")
                {
                    return Some(frame);
                }
                match self.stream.read_buf(&mut self.buffer).await {
                    Ok(0) | Err(_) => return None,
                    Ok(_) => {}
                }
            }
        })
        .await
        .map_err(|_| ())
    }

    /// The next reply's bytes as they arrived, however deep (measured, never built); panics after
    /// 10 s or if the server closes first.
    pub async fn read_raw(&mut self) -> Bytes {
        tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                if let Some(len) =
                    tollgate_resp::frame_len(&self.buffer, &Limits::default()).expect("valid RESP")
                {
                    return self.buffer.split_to(len).freeze();
                }
                match self.stream.read_buf(&mut self.buffer).await {
                    Ok(0) | Err(_) => panic!("connection closed before a reply"),
                    Ok(_) => {}
                }
            }
        })
        .await
        .expect("a reply in time")
    }

    /// Reads until the server closes the connection; returns every frame seen.
    pub async fn read_until_closed(&mut self, limit: Duration) -> Vec<Frame> {
        let mut frames = Vec::new();
        while let Ok(Some(frame)) = self.read_within(limit).await {
            frames.push(frame);
        }
        frames
    }
}

/// The text of a simple, bulk or error frame.
pub fn text(frame: &Frame) -> String {
    frame
        .as_bytes()
        .map(|b| String::from_utf8_lossy(b).into_owned())
        .unwrap_or_else(|| format!("{frame:?}"))
}
