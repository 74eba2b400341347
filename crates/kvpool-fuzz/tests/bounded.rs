//! The bounded fuzz run of the default test suite, on stable Rust and
//! without libFuzzer: every input of `fuzz/corpus/<target>/` through its
//! target, then seeded random mutations of that corpus (bit flips, byte
//! inserts and deletes, splices between inputs, length fields set to edge
//! values) for a bounded time per target.
//!
//! `KVPOOL_FUZZ_SECS` sets the seconds per target (default 1.5) for a
//! longer run; `KVPOOL_FUZZ_SEED` picks another mutation sequence. A panic
//! names the target and prints the input in hex (and saves it under the
//! target directory) so it can be added to the corpus; an input that runs
//! for more than a minute is reported the same way, then the run aborts.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kvpool_fuzz::Target;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Seconds per target when `KVPOOL_FUZZ_SECS` is not set.
const DEFAULT_SECS: f64 = 1.5;
/// Mutants are cut to this length (the largest seeds are segment images).
const MAX_LEN: usize = 64 << 10;
/// An input running longer than this is a hang.
const HANG: Duration = Duration::from_secs(60);

macro_rules! targets {
    ($($name:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                fuzz(stringify!($name), kvpool_fuzz::$name);
            }
        )*
        /// The targets given a test here.
        const TESTED: &[&str] = &[$(stringify!($name)),*];
    };
}

targets!(
    frame,
    message,
    object_header,
    superblock,
    segment,
    validators,
    http,
    rbg_spec,
    rbg_control,
);

#[test]
fn every_target_has_a_test_and_a_corpus() {
    for (name, _) in kvpool_fuzz::TARGETS {
        assert!(TESTED.contains(name), "no bounded run for target {name}");
        let inputs = corpus(name);
        assert!(!inputs.is_empty(), "no corpus for target {name}");
    }
    assert_eq!(TESTED.len(), kvpool_fuzz::TARGETS.len());
}

fn corpus_dir(target: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz/corpus")
        .join(target)
}

/// The corpus of `target`, by file name.
fn corpus(target: &str) -> Vec<(String, Vec<u8>)> {
    let Ok(dir) = std::fs::read_dir(corpus_dir(target)) else {
        return Vec::new();
    };
    let mut inputs: Vec<(String, Vec<u8>)> = dir
        .flatten()
        .filter(|e| e.path().is_file())
        .map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let bytes = std::fs::read(e.path()).expect("corpus file");
            (name, bytes)
        })
        .collect();
    inputs.sort();
    inputs
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Reports `input` of `target` (what it is, in hex, saved to a file).
fn report(target: &str, what: &str, input: &[u8]) -> String {
    let path = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("fuzz-{target}-failure"));
    let saved = match std::fs::write(&path, input) {
        Ok(()) => format!("saved as {}", path.display()),
        Err(e) => format!("not saved: {e}"),
    };
    format!(
        "fuzz target {target} failed on {what} ({} bytes, {saved}); add it to \
         fuzz/corpus/{target}/ once fixed (docs/fuzzing.md). Input in hex:\n{}",
        input.len(),
        hex(input)
    )
}

/// Aborts the process when one input runs past [`HANG`], after reporting it.
struct Watchdog {
    current: Arc<Mutex<(Instant, String, Vec<u8>)>>,
    done: Arc<AtomicBool>,
}

impl Watchdog {
    fn start(target: &'static str) -> Watchdog {
        let current = Arc::new(Mutex::new((Instant::now(), String::new(), Vec::new())));
        let done = Arc::new(AtomicBool::new(false));
        let (c, d) = (current.clone(), done.clone());
        std::thread::spawn(move || {
            while !d.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(200));
                let guard = c.lock().unwrap_or_else(|p| p.into_inner());
                let (since, what, input) = &*guard;
                if since.elapsed() > HANG && !d.load(Ordering::Relaxed) {
                    eprintln!("HANG: {}", report(target, what, input));
                    std::process::abort();
                }
            }
        });
        Watchdog { current, done }
    }

    /// Runs `f` on `input`, failing the test with a report on a panic.
    fn run(&self, target: &str, f: Target, what: String, input: &[u8]) {
        *self.current.lock().unwrap_or_else(|p| p.into_inner()) =
            (Instant::now(), what, input.to_vec());
        if catch_unwind(AssertUnwindSafe(|| f(input))).is_err() {
            let what = self
                .current
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .1
                .clone();
            self.done.store(true, Ordering::Relaxed);
            panic!("{}", report(target, &what, input));
        }
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.done.store(true, Ordering::Relaxed);
    }
}

/// The corpus of `target`, then mutants of it until its time is up.
fn fuzz(target: &'static str, f: Target) {
    let secs: f64 = env_or("KVPOOL_FUZZ_SECS", DEFAULT_SECS);
    let seed: u64 = env_or("KVPOOL_FUZZ_SEED", 0);
    let dog = Watchdog::start(target);
    let inputs = corpus(target);
    for (name, bytes) in &inputs {
        dog.run(target, f, format!("corpus file {name}"), bytes);
    }
    let pool: Vec<&[u8]> = inputs.iter().map(|(_, b)| b.as_slice()).collect();
    let mut rng = StdRng::seed_from_u64(seed ^ xxhash_rust::xxh3::xxh3_64(target.as_bytes()));
    let deadline = Instant::now() + Duration::from_secs_f64(secs.max(0.0));
    let mut n = 0u64;
    let mut last = Vec::new();
    while Instant::now() < deadline {
        // Mostly fresh mutants of the corpus; sometimes a mutant of the last one.
        let mut input = match pool.is_empty() || rng.gen_ratio(1, 4) {
            true => std::mem::take(&mut last),
            false => pool[rng.gen_range(0..pool.len())].to_vec(),
        };
        mutate(&mut rng, &mut input, &pool);
        dog.run(target, f, format!("mutant {n} of seed {seed}"), &input);
        last = input;
        n += 1;
    }
    eprintln!(
        "{target}: {} corpus inputs, {n} mutants in {secs}s",
        inputs.len()
    );
}

/// Values length and count fields are most often wrong by.
fn interesting(rng: &mut StdRng, len: usize) -> u64 {
    const EDGES: [u64; 16] = [
        0,
        1,
        0x7f,
        0x80,
        0xff,
        0x100,
        0xffff,
        4096,
        16_384,
        16_385,
        16 << 20,
        0x7fff_ffff,
        0xffff_ffff,
        1 << 32,
        i64::MAX as u64,
        u64::MAX,
    ];
    match rng.gen_range(0..4) {
        0 => len as u64,
        1 => (len as u64).wrapping_sub(1),
        2 => len as u64 + 1,
        _ => EDGES[rng.gen_range(0..EDGES.len())],
    }
}

/// Applies one to four random edits to `input`.
fn mutate(rng: &mut StdRng, input: &mut Vec<u8>, pool: &[&[u8]]) {
    for _ in 0..rng.gen_range(1..=4) {
        let len = input.len();
        let at = rng.gen_range(0..=len);
        match rng.gen_range(0..8) {
            0 if len > 0 => {
                let i = rng.gen_range(0..len);
                input[i] ^= 1 << rng.gen_range(0..8);
            }
            1 if len > 0 => {
                let i = rng.gen_range(0..len);
                input[i] = interesting(rng, len) as u8;
            }
            2 => {
                let n = rng.gen_range(1..=8);
                let bytes: Vec<u8> = (0..n).map(|_| rng.gen()).collect();
                input.splice(at..at, bytes);
            }
            3 if at < len => {
                let n = rng.gen_range(1..=(len - at).min(32));
                input.drain(at..at + n);
            }
            4 if at < len => {
                // Repeat a chunk of the input somewhere else.
                let n = rng.gen_range(1..=(len - at).min(64));
                let chunk = input[at..at + n].to_vec();
                let to = rng.gen_range(0..=len);
                input.splice(to..to, chunk);
            }
            5 if !pool.is_empty() => {
                // Splice: this input's head, another one's tail.
                let other = pool[rng.gen_range(0..pool.len())];
                let from = rng.gen_range(0..=other.len());
                input.truncate(at);
                input.extend_from_slice(&other[from..]);
            }
            6 => {
                // A length or count field: little-endian of 2, 4 or 8 bytes,
                // or a postcard varint.
                let v = interesting(rng, len);
                let bytes = match rng.gen_range(0..4) {
                    0 => (v as u16).to_le_bytes().to_vec(),
                    1 => (v as u32).to_le_bytes().to_vec(),
                    2 => v.to_le_bytes().to_vec(),
                    _ => varint(v),
                };
                let end = (at + bytes.len()).min(len);
                input.splice(at..end, bytes);
            }
            7 => input.truncate(at),
            _ => {}
        }
    }
    input.truncate(MAX_LEN);
}

/// `v` as postcard writes a `u64` (LEB128).
fn varint(mut v: u64) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let b = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            out.push(b);
            return out;
        }
        out.push(b | 0x80);
    }
}
