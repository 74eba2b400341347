//! The short chaos campaign of the default suite (docs/chaos.md): the real
//! `kvpool` binary as a multi-host pool in network namespaces (3 etcd
//! members, 3 HA masters, 4 stores, 3 client processes), faults from fixed
//! seeds, and the history checker. Every rule must hold: zero violations,
//! zero crashes.
//!
//! It needs root and iproute2 (CI runs as root) and fails, never skips,
//! without them. Its own executable doubles as the campaign's client
//! processes (`chaos-worker ...`), hence `harness = false` and this main.
//! Timings are reported, never asserted: speed claims come from the
//! harness's long runs (README).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use kvpool_chaos::campaign::{self, CampaignConfig};
use kvpool_chaos::schedule::Scenario;

const NAME: &str = "short_campaign";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("chaos-worker") {
        return kvpool_chaos::workload::worker_main(args[2..].to_vec());
    }
    // Enough of libtest's command line for `cargo test` filters and --list.
    let flags: Vec<&str> = args[1..].iter().map(String::as_str).collect();
    if flags.contains(&"--list") {
        println!("{NAME}: test");
        return ExitCode::SUCCESS;
    }
    let filters: Vec<&&str> = flags.iter().filter(|a| !a.starts_with('-')).collect();
    if flags.contains(&"--ignored")
        || (!filters.is_empty() && !filters.iter().any(|f| NAME.contains(**f)))
    {
        println!("running 0 tests");
        return ExitCode::SUCCESS;
    }
    println!("running 1 test");
    kvpool_chaos::init_tracing();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    match rt.block_on(short_campaign()) {
        Ok(()) => {
            println!("test {NAME} ... ok");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("test {NAME} ... FAILED\n{e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Fixed seeds: one mixed campaign (every kind of fault, overlapping) and
/// one of store partitions, both on stores with a disk tier, and rolling
/// upgrades (one master or store at a
/// time, the leader included), between this build and the previous release
/// when `KVPOOL_PREVIOUS_BIN` names its binary (`scripts/test.sh` builds it
/// with `scripts/previous-release.sh`), else within this build.
async fn short_campaign() -> anyhow::Result<()> {
    let previous = std::env::var_os("KVPOOL_PREVIOUS_BIN").map(PathBuf::from);
    // scripts/previous-release.sh leaves that release's harness beside it.
    let previous_worker = (previous.as_ref()).map(|p| {
        vec![
            p.with_file_name("kvpool-chaos")
                .to_string_lossy()
                .into_owned(),
            "worker".into(),
        ]
    });
    let root = std::env::temp_dir().join(format!("kvchaos-test-{}", std::process::id()));
    let exe = std::env::current_exe()?.to_string_lossy().into_owned();
    let mut failures = Vec::new();
    let campaigns = [
        (Scenario::Mixed, 1, 45),
        (Scenario::Partition, 2, 30),
        (Scenario::Upgrade, 3, 40),
    ];
    for (scenario, seed, secs) in campaigns {
        let dir = root.join(format!("{scenario:?}-{seed}").to_lowercase());
        let mut cfg = CampaignConfig::new(
            seed,
            scenario,
            dir,
            PathBuf::from(env!("CARGO_BIN_EXE_kvpool")),
            vec![exe.clone(), "chaos-worker".into()],
        );
        cfg.duration = Duration::from_secs(secs);
        cfg.topo.clients = 3;
        if matches!(scenario, Scenario::Mixed | Scenario::Partition) {
            // Stores with a disk tier and memory kept half full: objects
            // move between the tiers under every fault (thousands of
            // moves; the harness read replaced versions through copies
            // moves left behind, and lost objects to moves answered after
            // a partition healed, before those were fixed).
            cfg.segment_size = 4 << 20;
            cfg.disk_size = 32 << 20;
            cfg.keys = 2000;
        }
        if scenario == Scenario::Upgrade {
            cfg.previous.clone_from(&previous);
            cfg.previous_worker_cmd.clone_from(&previous_worker);
        }
        let r = campaign::run(cfg).await?;
        println!("{}", r.render());
        if r.problems() > 0 {
            // The crashes themselves: CI shows only the tail of the output.
            failures.push(format!(
                "{scenario:?} seed {seed}: {} violations, {} crashes (see {}){}",
                r.report.total(),
                r.crashes.len(),
                r.dir.display(),
                r.crashes
                    .iter()
                    .map(|c| format!("\n  {c}"))
                    .collect::<String>()
            ));
        }
    }
    anyhow::ensure!(failures.is_empty(), "{}", failures.join("\n"));
    if std::env::var_os("KVPOOL_CHAOS_KEEP").is_none() {
        let _ = std::fs::remove_dir_all(&root);
    }
    Ok(())
}
