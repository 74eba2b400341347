//! The control socket of a running group.
//!
//! Protocol: the client connects to `<state>/<group>/control.sock`, writes
//! one JSON [`Request`] on one line, and reads one JSON [`Response`] line.
//! One request per connection keeps both ends trivial; the socket is local
//! and owned by the user (the state dir is created mode 0700).

use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{mpsc, oneshot};

use super::images::ImageMap;
use super::state::{GroupStatus, HistoryEntry};

/// Largest request accepted (a spec file plus an image map).
const MAX_REQUEST: usize = 4 << 20;

/// A request to the running group.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    /// The group's status.
    Status,
    /// Replace the spec; `images` replaces the image map when given.
    Apply {
        /// The new spec, as YAML text.
        spec: String,
        /// A new image map (absolute paths).
        images: Option<ImageMap>,
    },
    /// The revision history.
    History,
    /// Re-apply an earlier history entry (the previous one by default).
    Undo {
        /// History number to go back to.
        to: Option<u64>,
    },
    /// Stop the group (reverse dependency order) and exit.
    Down,
}

/// The answer to a [`Request`].
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "result", rename_all = "snake_case")]
pub enum Response {
    /// Answer to `Status`.
    Status {
        /// The status.
        status: GroupStatus,
    },
    /// Answer to `Apply` and `Undo`.
    Applied {
        /// New history number (unchanged when nothing changed).
        generation: u64,
        /// Roles whose revision changed, as `role: old -> new`.
        changed: Vec<String>,
        /// Fields present but not implemented.
        unimplemented: Vec<String>,
    },
    /// Answer to `History`.
    History {
        /// Entries, oldest first.
        entries: Vec<HistoryEntry>,
    },
    /// Answer to `Down`, sent once every instance has stopped.
    Stopped,
    /// The request failed.
    Error {
        /// Why.
        message: String,
    },
}

/// Errors talking to a group.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    /// Nothing listens on the socket.
    #[error("group is not running (no control socket at {0})")]
    NotRunning(String),
    /// The exchange failed.
    #[error("control socket {path}: {message}")]
    Io {
        /// The socket.
        path: String,
        /// What went wrong.
        message: String,
    },
}

/// Sends one request and waits up to `timeout` for the answer.
pub async fn call(
    socket: &Path,
    req: &Request,
    timeout: Duration,
) -> Result<Response, ControlError> {
    let path = socket.display().to_string();
    let io = |e: String| ControlError::Io {
        path: path.clone(),
        message: e,
    };
    let mut stream = match UnixStream::connect(socket).await {
        Ok(s) => s,
        Err(_) => return Err(ControlError::NotRunning(path.clone())),
    };
    let exchange = async {
        let mut line = serde_json::to_vec(req).map_err(|e| io(e.to_string()))?;
        line.push(b'\n');
        stream
            .write_all(&line)
            .await
            .map_err(|e| io(e.to_string()))?;
        let mut reader = BufReader::new(stream);
        let mut answer = String::new();
        reader
            .read_line(&mut answer)
            .await
            .map_err(|e| io(e.to_string()))?;
        if answer.is_empty() {
            return Err(io(
                "the group closed the connection without answering".into()
            ));
        }
        serde_json::from_str(&answer).map_err(|e| io(format!("bad answer: {e}")))
    };
    tokio::time::timeout(timeout, exchange)
        .await
        .map_err(|_| io(format!("no answer within {timeout:?}")))?
}

/// True when a running group answers on `socket` (a socket file can be
/// left over from a run that died).
pub async fn is_live(socket: &Path) -> bool {
    socket.exists()
        && call(socket, &Request::History, Duration::from_secs(2))
            .await
            .is_ok()
}

/// A request received by the server, with the way back to its client.
pub type Incoming = (Request, oneshot::Sender<Response>);

/// Accepts connections forever, forwarding each request to `tx`.
pub async fn serve(listener: UnixListener, tx: mpsc::Sender<Incoming>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let tx = tx.clone();
        tokio::spawn(async move {
            let (rd, mut wr) = stream.into_split();
            let mut reader = BufReader::new(rd).take(MAX_REQUEST as u64);
            let mut line = String::new();
            let resp = match reader.read_line(&mut line).await {
                Err(e) => Response::Error {
                    message: format!("reading the request: {e}"),
                },
                Ok(_) => match serde_json::from_str::<Request>(&line) {
                    Err(e) => Response::Error {
                        message: format!("bad request: {e}"),
                    },
                    Ok(req) => {
                        let (rtx, rrx) = oneshot::channel();
                        if tx.send((req, rtx)).await.is_err() {
                            Response::Error {
                                message: "the group is shutting down".into(),
                            }
                        } else {
                            rrx.await.unwrap_or(Response::Error {
                                message: "the group stopped before answering".into(),
                            })
                        }
                    }
                },
            };
            if let Ok(mut out) = serde_json::to_vec(&resp) {
                out.push(b'\n');
                let _ = wr.write_all(&out).await;
            }
        });
    }
}
