//! The engine end to end: a real server on 127.0.0.1 and a client engine
//! with its own registered memory, moving bytes both ways, over TCP and
//! over the same-host socket (copies, and bytes through the socket).

use std::sync::Arc;
use std::time::Duration;

use kvpool_engine::{
    timeout_secs, Direction, Engine, EngineServer, Memory, Notifies, Regions, SameHost, Transfer,
};
use kvpool_net::auth::{Credentials, Security};
use kvpool_proto::Code;

/// A process's side: its regions, a server over them and a client engine.
struct Side {
    regions: Arc<Regions>,
    server: EngineServer,
    engine: Engine,
}

impl Side {
    async fn start(security: Security) -> Side {
        Side::start_with(security, SameHost::Copy).await
    }

    /// A side whose server and client treat same-host peers as `same_host`.
    async fn start_with(security: Security, same_host: SameHost) -> Side {
        let regions = Arc::new(Regions::new());
        let notifies = Arc::new(Notifies::new());
        let server = EngineServer::bind(
            "127.0.0.1:0",
            regions.clone(),
            notifies,
            security.clone(),
            same_host,
        )
        .await
        .unwrap();
        let engine = Engine::new(regions.clone(), security)
            .with_timeout(Duration::from_secs(10))
            .with_same_host(same_host != SameHost::Off);
        Side {
            regions,
            server,
            engine,
        }
    }

    fn session(&self) -> String {
        self.server.local_addr().to_string()
    }

    /// Registers `buf` (which the test keeps alive and unmoved until the
    /// side is dropped) and returns its address.
    fn register(&self, buf: &mut [u8]) -> u64 {
        let addr = buf.as_mut_ptr() as u64;
        // SAFETY: every test keeps its buffers alive past its sides.
        unsafe { self.regions.register(addr, buf.len() as u64, Memory::Host) }.unwrap();
        addr
    }
}

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn all_ok(results: &[kvpool_proto::KvResult<()>]) {
    for (i, r) in results.iter().enumerate() {
        assert!(r.is_ok(), "item {i}: {r:?}");
    }
}

/// Each way a decode side's server can treat same-host peers, and the
/// link a prefill side on the same host then reaches it by.
const LINKS: [(SameHost, &str); 3] = [
    (SameHost::Copy, "copy"),
    (SameHost::Socket, "socket"),
    (SameHost::Off, "tcp"),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_blocks_round_trip_both_ways() {
    for (mode, link) in LINKS {
        round_trip(mode, link).await;
    }
}

/// 90 blocks written and read back, with the decode side's server (and
/// both clients) treating same-host peers as `mode`; the prefill side
/// reached decode by `link`.
async fn round_trip(mode: SameHost, link: &str) {
    let (prefill, decode) = (
        Side::start_with(Security::default(), SameHost::Copy).await,
        Side::start_with(Security::default(), mode).await,
    );
    // Blocks of 4 KiB .. 4 MiB, laid end to end in one buffer per side.
    let sizes: Vec<u64> = [4 << 10, 64 << 10, 512 << 10, 4 << 20, 4 << 10, 1 << 20]
        .iter()
        .cycle()
        .take(90)
        .copied()
        .collect();
    let total: u64 = sizes.iter().sum();
    let mut src = pattern(1, total as usize);
    let mut dst = vec![0u8; total as usize];
    let mut back = vec![0u8; total as usize];
    let s = prefill.register(&mut src);
    let b = prefill.register(&mut back);
    let d = decode.register(&mut dst);
    let mut at = 0;
    let items: Vec<Transfer> = sizes
        .iter()
        .map(|&len| {
            let t = Transfer {
                local: s + at,
                remote: d + at,
                len,
            };
            at += len;
            t
        })
        .collect();
    let peer = decode.session();
    all_ok(&prefill.engine.write(&peer, &items).await);
    assert!(dst == src, "decode's buffer holds what prefill wrote");
    // Read everything back into another local buffer.
    let reads: Vec<Transfer> = items
        .iter()
        .map(|t| Transfer {
            local: b + (t.local - s),
            ..*t
        })
        .collect();
    all_ok(&prefill.engine.read(&peer, &reads).await);
    assert!(back == src, "what was read back is what was written");
    assert_eq!(prefill.engine.link(&peer), link);
    drop((prefill, decode));
}

/// A caller's own thread moves bytes by itself (`transfer_blocking`),
/// copied, through the same-host socket or over TCP as the peer allows,
/// with each item checked as on the shared path; it declines (and moves
/// nothing) for a peer the shared path has not reached yet, inside a
/// runtime, and once a connection of its own to the peer broke.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_callers_thread_moves_bytes_itself() {
    for (mode, link) in LINKS {
        caller_driven(mode, link).await;
    }
}

/// How long the caller-driven tests spin at each wait.
const SPIN: Duration = Duration::from_micros(100);

async fn caller_driven(mode: SameHost, link: &str) {
    let (prefill, decode) = (
        Side::start(Security::default()).await,
        Side::start_with(Security::default(), mode).await,
    );
    let len = 64 << 10;
    let mut src = pattern(2, 4 * len);
    let mut dst = vec![0u8; 4 * len];
    let mut back = vec![0u8; 4 * len];
    let (s, b, d) = (
        prefill.register(&mut src),
        prefill.register(&mut back),
        decode.register(&mut dst),
    );
    let peer = decode.session();
    let blocking = |dir, items: &[Transfer]| {
        std::thread::scope(|sc| {
            sc.spawn(|| prefill.engine.transfer_blocking(&peer, dir, items, SPIN))
                .join()
                .unwrap()
        })
    };
    let at = |local: u64, i: u64, remote: u64| Transfer {
        local: local + i * len as u64,
        remote: remote + i * len as u64,
        len: len as u64,
    };
    let first = [at(s, 0, d)];
    assert!(
        blocking(Direction::Write, &first).is_none(),
        "{link}: peer not reached yet"
    );
    assert!(
        prefill
            .engine
            .transfer_blocking(&peer, Direction::Write, &first, SPIN)
            .is_none(),
        "{link}: declined inside a runtime"
    );
    assert_eq!(
        dst[..len],
        vec![0u8; len][..],
        "{link}: a declined call moves nothing"
    );
    all_ok(&prefill.engine.write(&peer, &first).await);
    // Items 1-3, one aimed past the end of decode's registered memory.
    let mut writes = vec![at(s, 1, d), at(s, 2, d), at(s, 3, d)];
    writes[1].remote = d + 4 * len as u64;
    let results = blocking(Direction::Write, &writes).expect("a reached peer");
    assert!(
        results[0].is_ok() && results[2].is_ok(),
        "{link}: {results:?}"
    );
    assert_eq!(results[1].as_ref().unwrap_err().code, Code::InvalidParams);
    assert!(dst[len..2 * len] == src[len..2 * len] && dst[3 * len..] == src[3 * len..]);
    assert_eq!(
        dst[2 * len..3 * len],
        vec![0u8; len][..],
        "{link}: refused item landed"
    );
    let reads: Vec<Transfer> = [0, 1, 3].iter().map(|&i| at(b, i, d)).collect();
    all_ok(&blocking(Direction::Read, &reads).expect("a reached peer"));
    assert!(back[..2 * len] == src[..2 * len] && back[3 * len..] == src[3 * len..]);
    assert_eq!(prefill.engine.link(&peer), link);
    // The peer goes (serving what it had already taken): a call on the
    // connection that broke fails, and the next is left to the shared
    // path.
    drop(decode);
    let mut failed = false;
    for _ in 0..500 {
        match blocking(Direction::Read, &reads) {
            Some(r) => failed |= r.iter().any(Result::is_err),
            None => break,
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(failed, "{link}: calls went on after the peer went");
    assert!(
        blocking(Direction::Read, &reads).is_none(),
        "{link}: after a break"
    );
    drop(prefill);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outside_registered_memory_is_refused_and_lands_nothing() {
    let (a, b) = (
        Side::start(Security::default()).await,
        Side::start(Security::default()).await,
    );
    let mut src = pattern(2, 8192);
    let mut whole = vec![0xEEu8; 3 * 4096];
    let s = a.register(&mut src);
    // Register only the middle page of `whole`: the pages around it are
    // the peer's too, just not offered.
    let mid = whole.as_mut_ptr() as u64 + 4096;
    // SAFETY: `whole` outlives the sides.
    unsafe { b.regions.register(mid, 4096, Memory::Host) }.unwrap();
    let peer = b.session();
    let bad = [
        // Straddles the end of the region.
        Transfer {
            local: s,
            remote: mid + 2048,
            len: 4096,
        },
        // Starts before it.
        Transfer {
            local: s,
            remote: mid - 1,
            len: 16,
        },
        // Nowhere near.
        Transfer {
            local: s,
            remote: 0x1000,
            len: 4096,
        },
        // Wraps the address space.
        Transfer {
            local: s,
            remote: u64::MAX - 8,
            len: 4096,
        },
    ];
    let results = a.engine.write(&peer, &bad).await;
    for (i, r) in results.iter().enumerate() {
        let e = r.as_ref().unwrap_err();
        assert_eq!(e.code, Code::InvalidParams, "item {i}: {e}");
    }
    assert!(whole.iter().all(|&x| x == 0xEE), "nothing landed");
    let results = a.engine.read(&peer, &bad).await;
    assert!(results.iter().all(|r| r.is_err()));
    // A local buffer outside this engine's registered memory fails too,
    // without being read.
    let r = a
        .engine
        .write(
            &peer,
            &[Transfer {
                local: 0x10,
                remote: mid,
                len: 16,
            }],
        )
        .await;
    assert_eq!(r[0].as_ref().unwrap_err().code, Code::InvalidParams);
    // The next transfers (on the same pooled connection) work.
    let ok = Transfer {
        local: s,
        remote: mid,
        len: 4096,
    };
    let mixed = a.engine.write(&peer, &[bad[0], ok, bad[1]]).await;
    assert!(mixed[0].is_err() && mixed[1].is_ok() && mixed[2].is_err());
    assert_eq!(&whole[4096..8192], &src[..4096]);
    assert!(whole[..4096].iter().all(|&x| x == 0xEE));
    assert!(whole[8192..].iter().all(|&x| x == 0xEE));
    drop((a, b));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_peers_and_dead_ports_fail_every_item() {
    let a = Side::start(Security::default()).await;
    let mut src = vec![1u8; 4096];
    let s = a.register(&mut src);
    // A port that was just free: nobody listens there.
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().to_string()
    };
    let items = [Transfer {
        local: s,
        remote: 0x1000,
        len: 4096,
    }; 3];
    for peer in [
        dead.as_str(),
        "no-such-host.invalid:1234",
        "not a session id",
    ] {
        let t0 = std::time::Instant::now();
        let r = a.engine.write(peer, &items).await;
        assert_eq!(r.len(), 3);
        assert!(r.iter().all(|r| r.is_err()), "{peer}: {r:?}");
        assert!(t0.elapsed() < Duration::from_secs(10), "{peer} hung");
    }
    drop(a);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_secret_peers_without_the_key_are_refused() {
    let key = Credentials::from_cluster_secret(b"engine test secret, 16+ bytes").unwrap();
    let secured = Security::with_key(Some(key.clone()));
    let server = Side::start(secured.clone()).await;
    let friend = Side::start(secured).await;
    let stranger = Side::start(Security::default()).await;
    let other = Credentials::from_cluster_secret(b"another cluster's secret!!").unwrap();
    let impostor = Side::start(Security::with_key(Some(other))).await;
    let mut dst = vec![0u8; 4096];
    let d = server.register(&mut dst);
    let mut src = pattern(3, 4096);
    let (mut src2, mut src3) = (src.clone(), src.clone());
    let (f, st, im) = (
        friend.register(&mut src),
        stranger.register(&mut src2),
        impostor.register(&mut src3),
    );
    let peer = server.session();
    let item = |local| Transfer {
        local,
        remote: d,
        len: 4096,
    };
    for (side, local) in [(&stranger, st), (&impostor, im)] {
        let r = side.engine.write(&peer, &[item(local)]).await;
        assert!(r[0].is_err(), "{r:?}");
    }
    assert!(dst.iter().all(|&x| x == 0), "nothing landed");
    all_ok(&friend.engine.write(&peer, &[item(f)]).await);
    assert_eq!(dst, src);
    drop((server, friend, stranger, impostor));
}

/// A timeout too large for a deadline is refused, not a panic at the
/// first transfer (`MC_TRANSFER_TIMEOUT=1e19` once was).
#[test]
fn timeouts_are_positive_and_bounded() {
    assert_eq!(
        timeout_secs(2.5),
        Some(std::time::Duration::from_millis(2500))
    );
    for bad in [0.0, -1.0, f64::NAN, f64::INFINITY, 1e10, 1e19] {
        assert_eq!(timeout_secs(bad), None, "{bad}");
    }
}

/// The stand-in CUDA driver (`tests/fake_cuda.c`), built here and loaded
/// into this process as `libcuda.so.1`, where the engine finds it as it
/// finds the real one: its device memory is address space the CPU cannot
/// touch, reached only through the driver's copies.
struct FakeCuda {
    alloc: AllocFn,
    poke: PokeFn,
    peek: PeekFn,
    copies: CopiesFn,
}

/// `fake_cuda_alloc(size_t len)`: device memory, 0 when none.
type AllocFn = unsafe extern "C" fn(usize) -> u64;
/// `fake_cuda_poke(dst, src, n)`: writes device memory, 0 or an error.
type PokeFn = unsafe extern "C" fn(u64, *const u8, usize) -> i32;
/// `fake_cuda_peek(dst, src, n)`: reads device memory, 0 or an error.
type PeekFn = unsafe extern "C" fn(*mut u8, u64, usize) -> i32;
/// `fake_cuda_copies()`: the driver copies made so far.
type CopiesFn = unsafe extern "C" fn() -> u64;

impl FakeCuda {
    fn get() -> &'static FakeCuda {
        static FAKE: std::sync::OnceLock<FakeCuda> = std::sync::OnceLock::new();
        FAKE.get_or_init(|| {
            let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("fake-cuda");
            std::fs::create_dir_all(&dir).unwrap();
            let lib = dir.join("libcuda.so.1");
            let src = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fake_cuda.c");
            let built = std::process::Command::new("cc")
                .args(["-shared", "-fPIC", "-O1", "-Wl,-soname,libcuda.so.1", "-o"])
                .arg(&lib)
                .arg(src)
                .status()
                .expect("a C compiler (cc) to build the stand-in CUDA driver");
            assert!(built.success(), "building {src}");
            let path = std::ffi::CString::new(lib.to_str().unwrap()).unwrap();
            // SAFETY: loads a library whose only constructor-free C code is
            // above; it stays loaded for the process's life.
            let handle = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
            assert!(!handle.is_null(), "dlopen {}", lib.display());
            let sym = |name: &std::ffi::CStr| {
                // SAFETY: a lookup in a live handle.
                let p = unsafe { libc::dlsym(handle, name.as_ptr()) };
                assert!(!p.is_null(), "{name:?}");
                p
            };
            // SAFETY: each symbol is the C function of that name in
            // fake_cuda.c, whose signature the field's type spells.
            unsafe {
                use std::mem::transmute;
                type Sym = *mut libc::c_void;
                FakeCuda {
                    alloc: transmute::<Sym, AllocFn>(sym(c"fake_cuda_alloc")),
                    poke: transmute::<Sym, PokeFn>(sym(c"fake_cuda_poke")),
                    peek: transmute::<Sym, PeekFn>(sym(c"fake_cuda_peek")),
                    copies: transmute::<Sym, CopiesFn>(sym(c"fake_cuda_copies")),
                }
            }
        })
    }

    /// `len` bytes of device memory holding `bytes` (zeros past them).
    fn alloc(&self, len: usize, bytes: &[u8]) -> u64 {
        // SAFETY: the fake's C functions, with buffers valid for the lengths.
        unsafe {
            let addr = (self.alloc)(len);
            assert_ne!(addr, 0, "fake device allocation");
            assert_eq!((self.poke)(addr, bytes.as_ptr(), bytes.len()), 0);
            addr
        }
    }

    /// The `len` bytes of device memory at `addr`.
    fn peek(&self, addr: u64, len: usize) -> Vec<u8> {
        let mut out = vec![0u8; len];
        // SAFETY: as above.
        assert_eq!(unsafe { (self.peek)(out.as_mut_ptr(), addr, len) }, 0);
        out
    }

    /// Driver copies made so far, by anyone in the process.
    fn copies(&self) -> u64 {
        // SAFETY: as above.
        unsafe { (self.copies)() }
    }
}

/// GPU memory, on either side and either way, moves through the CUDA
/// driver's copies and host buffers: never touched by the CPU or handed to
/// the kernel (the stand-in driver's device memory would fault), over TCP
/// and on the same-host socket, where a peer asked to copy with GPU
/// memory says it cannot and the bytes go through the socket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gpu_memory_moves_through_the_drivers_copies() {
    let cuda = FakeCuda::get();
    for (mode, link) in [
        (SameHost::Copy, "socket"),
        (SameHost::Socket, "socket"),
        (SameHost::Off, "tcp"),
    ] {
        gpu_round_trip(cuda, mode, link).await;
    }
}

async fn gpu_round_trip(cuda: &FakeCuda, mode: SameHost, link: &str) {
    let (prefill, decode) = (
        Side::start(Security::default()).await,
        Side::start_with(Security::default(), mode).await,
    );
    let sizes = [4u64 << 10, 512 << 10, (1 << 20) + 3];
    let total: u64 = sizes.iter().sum();
    let n = total as usize;
    let (host_bytes, gpu_bytes) = (pattern(3, n), pattern(4, n));
    let mut host_src = host_bytes.clone();
    let mut host_back = vec![0u8; n];
    let gpu_src = cuda.alloc(n, &gpu_bytes);
    let gpu_back = cuda.alloc(n, &[]);
    let gpu_dst = cuda.alloc(2 * n, &[]);
    let on_gpu = |side: &Side, addr: u64, len: u64| {
        let memory = Memory::locate(addr, len).unwrap();
        assert!(memory.device().is_some(), "{addr:#x} is GPU memory");
        // SAFETY: the fake's allocations are never freed.
        unsafe { side.regions.register(addr, len, memory) }.unwrap();
    };
    on_gpu(&prefill, gpu_src, total);
    on_gpu(&prefill, gpu_back, total);
    on_gpu(&decode, gpu_dst, 2 * total);
    let mut host_dst = vec![0u8; n];
    let hs = prefill.register(&mut host_src);
    let hb = prefill.register(&mut host_back);
    let hd = decode.register(&mut host_dst);
    assert_eq!(Memory::locate(hs, total).unwrap(), Memory::Host);
    assert_eq!(
        Memory::locate(gpu_dst + total, 2 * total).unwrap_err().code,
        Code::InvalidParams,
        "a range running off GPU memory"
    );
    // Items laid end to end from `local` and `remote`.
    let items = |local: u64, remote: u64| {
        let mut at = 0;
        sizes
            .iter()
            .map(|&len| {
                at += len;
                Transfer {
                    local: local + at - len,
                    remote: remote + at - len,
                    len,
                }
            })
            .collect::<Vec<_>>()
    };
    let before = cuda.copies();
    let peer = decode.session();
    // GPU to host first: the peer could copy with host memory, never
    // with the caller's GPU memory.
    all_ok(&prefill.engine.write(&peer, &items(gpu_src, hd)).await);
    assert!(
        host_dst == gpu_bytes,
        "{link}: GPU bytes in decode's host memory"
    );
    // Host to GPU and GPU to GPU, in one batch.
    let mut writes = items(hs, gpu_dst);
    writes.extend(items(gpu_src, gpu_dst + total));
    all_ok(&prefill.engine.write(&peer, &writes).await);
    assert!(
        cuda.peek(gpu_dst, n) == host_bytes,
        "{link}: host bytes in decode's GPU"
    );
    assert!(
        cuda.peek(gpu_dst + total, n) == gpu_bytes,
        "{link}: GPU bytes in decode's GPU"
    );
    // GPU to GPU and GPU to host, back.
    let mut reads = items(gpu_back, gpu_dst);
    reads.extend(items(hb, gpu_dst + total));
    all_ok(&prefill.engine.read(&peer, &reads).await);
    assert!(
        cuda.peek(gpu_back, n) == host_bytes,
        "{link}: read into GPU"
    );
    assert!(host_back == gpu_bytes, "{link}: read into host memory");
    // Each GPU item of the five batches crossed the driver once a side.
    assert_eq!(cuda.copies() - before, 21, "{link}: driver copies");
    assert_eq!(prefill.engine.link(&peer), link);
    drop((prefill, decode));
}
