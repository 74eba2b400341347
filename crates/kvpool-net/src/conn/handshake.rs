//! The server side of the handshake: TLS, the version agreed in `Hello`,
//! and the proof of a role key when the server asks for one.

use super::*;

/// Completes TLS (when `security` has it) and the handshake on an accepted
/// connection, as `server`, asking for proof of a key when `security` has
/// one, all within [`HANDSHAKE_TIMEOUT`]. `None` (after answering) when the
/// peer must be disconnected; on success the proved role is in
/// [`FramedConn::peer_role`].
pub async fn accept(
    stream: TcpStream,
    server: &str,
    limits: Limits,
    security: &Security,
) -> Option<FramedConn> {
    let accepted = async {
        let mut conn = FramedConn::accept(stream, limits, security.tls.as_ref()).await?;
        handshake(&mut conn, server, security.credentials.as_ref())
            .await
            .then_some(conn)
    };
    tokio::time::timeout(HANDSHAKE_TIMEOUT, accepted)
        .await
        .ok()
        .flatten()
}

/// [`accept`] for a Unix socket: no TLS (the kernel carries the bytes),
/// the same handshake. The caller checked who connected (its credentials).
pub async fn accept_unix(
    stream: tokio::net::UnixStream,
    peer: String,
    server: &str,
    limits: Limits,
    security: &Security,
) -> Option<FramedConn> {
    let mut conn = FramedConn::from_unix(stream, peer, limits);
    let accepted = handshake(&mut conn, server, security.credentials.as_ref());
    match tokio::time::timeout(HANDSHAKE_TIMEOUT, accepted).await {
        Ok(true) => Some(conn),
        _ => None,
    }
}

async fn handshake(conn: &mut FramedConn, server: &str, keyring: Option<&Credentials>) -> bool {
    // A peer that may not prove a role is not offered it: an engine holding
    // a store key but no client certificate proceeds as a client.
    let ceiling = conn.ceiling;
    let challenge = keyring.map(|k| Challenge {
        nonce: rand::random(),
        max_role: k.role().min(ceiling).as_u8(),
    });
    let Some((hello, version)) = handshake_step(conn, Opcode::Hello, |meta| {
        let hello: Hello = msg::decode(meta)?;
        let Some(version) = compat::negotiate(hello.min_version, hello.version) else {
            return Err(KvError::new(
                Code::InvalidVersion,
                format!(
                    "this {server} speaks protocol {MIN_PROTOCOL_VERSION}..={PROTOCOL_VERSION} \
                     and the {} speaks {}..={}: no version in common, upgrade the older side",
                    hello.role, hello.min_version, hello.version
                ),
            ));
        };
        let reply = HelloReply {
            version,
            server: server.to_string(),
            challenge,
        };
        Ok(((hello, version), msg::encode(&reply)))
    })
    .await
    else {
        return false;
    };
    conn.version = version;
    let (Some(keyring), Some(challenge)) = (keyring, challenge) else {
        // No secret here: every peer may do everything (loopback or an
        // explicitly insecure deployment), within what TLS allows.
        conn.peer_role = ceiling;
        return true;
    };
    let peer = conn.peer.clone();
    let proved = handshake_step(conn, Opcode::Auth, |meta| {
        let (auth, AuthTenant { tenant }) = compat::decode_with::<Auth, AuthTenant>(meta)?;
        let key = match &tenant {
            // A tenant's key proves the client role, in its namespace.
            Some(name) => (auth.role == Role::Client.as_u8())
                .then(|| keyring.for_tenant(name).ok())
                .flatten(),
            None => Role::from_u8(auth.role)
                .filter(|r| *r <= ceiling)
                .and_then(|r| keyring.derive(r)),
        };
        match key {
            Some(key) if key.verify(false, &hello.nonce, &challenge.nonce, &auth.proof) => {
                let reply = AuthReply {
                    proof: key.server_proof(&hello.nonce, &challenge.nonce),
                };
                Ok(((key.role(), tenant), msg::encode(&reply)))
            }
            _ => {
                refused_auth(
                    &peer,
                    &format!("not a key of this cluster ({})", hello.role),
                );
                Err(KvError::new(
                    Code::Unauthorized,
                    "authentication failed: not a key of this cluster",
                ))
            }
        }
    })
    .await;
    match proved {
        Some((role, tenant)) => {
            conn.peer_role = role;
            conn.peer_tenant = tenant.map(Arc::from);
            true
        }
        None => false,
    }
}

/// One request of the handshake: reads a frame that must be `opcode` with a
/// message of at most [`MAX_HELLO`] bytes, answers with what `answer`
/// returns (or its error, after which the peer is disconnected).
async fn handshake_step<T>(
    conn: &mut FramedConn,
    opcode: Opcode,
    answer: impl FnOnce(&[u8]) -> KvResult<(T, Vec<u8>)>,
) -> Option<T> {
    let h = match conn.read_header().await {
        Ok(Some(h)) => h,
        Ok(None) => return None,
        Err(e) => {
            conn.reject(&e).await;
            return None;
        }
    };
    let reply = async {
        if h.opcode != opcode || h.kind != FrameKind::Request || h.payload_len != 0 {
            return Err(KvError::new(
                Code::InvalidParams,
                format!("expected {} in the handshake", opcode.name()),
            ));
        }
        if h.meta_len > MAX_HELLO {
            return Err(KvError::new(
                Code::InvalidParams,
                format!(
                    "a handshake message of {} bytes (at most {MAX_HELLO})",
                    h.meta_len
                ),
            ));
        }
        answer(conn.read_meta(h.meta_len).await?)
    }
    .await;
    let (value, sent) = match reply {
        Ok((v, meta)) => (Some(v), conn.send_response(&h, &meta, &[]).await),
        Err(e) => (None, conn.send_error(&h, &e).await),
    };
    // Flush even a refusal: the peer must learn why it is being disconnected.
    let flushed = sent.is_ok() && conn.flush().await.is_ok();
    value.filter(|_| flushed)
}

/// Answers a plaintext peer of a TLS server with a plaintext error to its
/// first request (so it learns why), then the caller drops it.
pub(super) async fn refuse_plaintext(conn: &mut FramedConn) {
    refused_auth(conn.peer(), "plaintext connection to a TLS server");
    handshake_step(conn, Opcode::Hello, |_| -> KvResult<((), Vec<u8>)> {
        Err(KvError::new(
            Code::Unauthorized,
            format!(
                "this server accepts TLS only: set --tls-ca ({}) to its cluster's CA bundle",
                crate::tls::CA_ENV
            ),
        ))
    })
    .await;
}

/// Logs a failed authentication, at most once a second per process: an
/// attacker's flood must not flood the log.
pub(super) fn refused_auth(peer: &str, why: &str) {
    static LAST: AtomicU64 = AtomicU64::new(0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    if LAST.swap(now, Ordering::Relaxed) != now {
        tracing::warn!(%peer, why, "authentication failed; closing (logged once a second)");
    }
}
