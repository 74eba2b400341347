//! The `kvpool` binary: parses flags, starts tracing, and dispatches to the
//! library crates. `master`, `store`, `up` (both in one process), `status`,
//! `bench` (a load generator), `bench-meta` (the master's metadata alone) and
//! `bench-groups` (a pool split over several masters).

mod bench;
mod bench_groups;
mod bench_meta;
mod bench_reuse;
mod cli;
mod config;
mod tls_cmd;

use std::process::ExitCode;

use tokio_util::sync::CancellationToken;

use cli::{Cli, Command};

fn main() -> ExitCode {
    config::adopt_mooncake_env();
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let cli = match config::parse(&args) {
        Ok(cli) => cli,
        Err(e) => match e.downcast::<clap::Error>() {
            Ok(usage) => usage.exit(),
            Err(e) => {
                eprintln!("kvpool: {e:#}");
                return ExitCode::FAILURE;
            }
        },
    };
    if let Some(n) = cli.max_connections_per_ip() {
        // The accept loops of kvpool-net read their per-address cap from
        // the environment; set it while this process is one thread.
        std::env::set_var(
            kvpool_net::server::MAX_CONNECTIONS_PER_IP_ENV,
            n.to_string(),
        );
    }
    if let Some(n) = cli.invalidations_kept() {
        // Read by the data server's table, likewise.
        std::env::set_var(kvpool_transfer::data::INVALIDATIONS_KEPT_ENV, n.to_string());
    }
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    // A line as each span closes: the `request{id, op}` spans (debug level,
    // so only under KVPOOL_LOG=debug) then show every request with its id
    // and time even when nothing inside logs.
    let log = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_span_events(tracing_subscriber::fmt::format::FmtSpan::CLOSE)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    tracing_subscriber::registry()
        .with(
            tracing_subscriber::EnvFilter::try_from_env("KVPOOL_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with(log)
        // What the status page lists as recent events.
        .with(kvpool_master::events::EventLayer)
        .init();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("kvpool: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(cli)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("kvpool: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// A token cancelled by the first SIGINT or SIGTERM.
fn shutdown_on_signal() -> CancellationToken {
    let token = CancellationToken::new();
    let t = token.clone();
    tokio::spawn(async move {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => return,
            };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        tracing::info!("signal received, shutting down");
        t.cancel();
    });
    token
}

async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Master(m) => {
            kvpool_master::map_large_allocations();
            let cfg = m.to_config()?;
            kvpool_master::run(cfg, shutdown_on_signal()).await?;
        }
        Command::Store(s) => {
            kvpool_store::run(s.to_config()?, shutdown_on_signal()).await?;
        }
        Command::Up(u) => {
            let shutdown = shutdown_on_signal();
            let mut mcfg = u.master.to_config()?;
            // The built-in store proves the store key derived from the master's.
            let mcfg_security = kvpool_net::auth::Security {
                credentials: (mcfg.security.credentials.as_ref())
                    .and_then(|c| c.derive(kvpool_net::auth::Role::Store)),
                ..mcfg.security.clone()
            };
            mcfg.metrics_address = mcfg.rpc_address.clone();
            let master = kvpool_master::start(mcfg, shutdown.clone()).await?;
            let scfg = kvpool_store::StoreConfig {
                master: master.rpc_addr.to_string(),
                segment_size: u.segment_size,
                data_dir: u.data_dir.clone(),
                address: master.rpc_addr.ip().to_string(),
                port: 0,
                name: None,
                shutdown_grace: std::time::Duration::ZERO,
                security: mcfg_security,
                disk_dir: u.disk.disk_dir()?,
                disk_size: u.disk.disk_size,
                disk_queue_depth: u.disk.disk_queue_depth,
                metrics_address: master.rpc_addr.ip().to_string(),
                metrics_port: u.store_metrics_port,
                http: u.master.http.limits(),
            };
            let mut store = tokio::spawn(kvpool_store::run(scfg, shutdown.clone()));
            // Announced once the pool can place objects (the store has
            // mounted its segment), not when the master listens: a client
            // started on that line would find no segment.
            let placeable = async {
                let state = &master.master.state;
                while !state.takes_new_objects(tokio::time::Instant::now()) {
                    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                }
            };
            tokio::select! {
                () = placeable => {
                    println!(
                        "kvpool is up: master {} (admin http://{}), segment {} in {}",
                        master.rpc_addr,
                        master.admin_addr,
                        cli::human(u.segment_size),
                        u.data_dir.display()
                    );
                    println!(
                        "clients use: KVPOOL_MASTER={}   stop with Ctrl-C",
                        master.rpc_addr
                    );
                }
                r = &mut store => {
                    let signalled = shutdown.is_cancelled();
                    shutdown.cancel();
                    master.stopped().await?;
                    r??;
                    if !signalled {
                        anyhow::bail!("the store stopped before it mounted its segment");
                    }
                    return Ok(ExitCode::SUCCESS);
                }
            }
            let r = store.await;
            shutdown.cancel();
            master.stopped().await?;
            r??;
        }
        Command::Status(s) => {
            let st =
                cli::call_master(&s.master, &s.security, &kvpool_proto::msg::Status {}).await?;
            print!("{}", cli::format_status(&s.master, &st));
        }
        Command::Drain(d) => {
            let req = kvpool_proto::msg::DrainSegment {
                segment: d.segment.clone(),
                unmount_after_ms: Some(d.grace.as_millis() as u64),
            };
            let ids = cli::call_master(&d.master, &d.security, &req).await?;
            for id in ids {
                println!(
                    "segment {} ({id}) draining; unmounted in {:?}",
                    d.segment, d.grace
                );
            }
        }
        Command::Bench(b) => {
            if !bench::run(b).await? {
                return Ok(ExitCode::FAILURE);
            }
        }
        Command::BenchMeta(b) => {
            // Measured as `kvpool master` holds it.
            kvpool_master::map_large_allocations();
            tokio::task::block_in_place(|| bench_meta::run(b))?
        }
        Command::BenchGroups(b) => {
            if !bench_groups::run(b).await? {
                return Ok(ExitCode::FAILURE);
            }
        }
        Command::BenchReuse(b) => {
            if !bench_reuse::run(b).await? {
                return Ok(ExitCode::FAILURE);
            }
        }
        Command::Secret(cli::SecretCommand::New { out }) => {
            let secret = kvpool_net::auth::new_cluster_secret();
            match out {
                None => println!("{secret}"),
                Some(path) => {
                    cli::write_private(&path, &format!("{secret}\n"))?;
                    println!("cluster secret written to {}", path.display());
                }
            }
        }
        Command::Tls(cli::TlsCommand::New { out, certs }) => {
            tls_cmd::new_pki(&out, &certs)?;
            let names: Vec<String> = certs.iter().map(|c| format!("{c}")).collect();
            println!(
                "CA and certificates for {} written to {}",
                names.join(", "),
                out.display()
            );
        }
        Command::Secret(cli::SecretCommand::Token { security }) => {
            let own = security.to_security()?.credentials.ok_or_else(|| {
                anyhow::anyhow!("no secret: pass --secret-file or set KVPOOL_SECRET_FILE")
            })?;
            println!("{}", own.http_token());
        }
        Command::Config(cli::ConfigCommand::Check {
            file,
            target,
            flags,
        }) => print!("{}", config::check(&file, target.as_deref(), &flags)?),
        Command::Secret(cli::SecretCommand::Derive {
            role,
            tenant,
            security,
        }) => {
            let own = security.to_security()?.credentials.ok_or_else(|| {
                anyhow::anyhow!("no secret: pass --secret-file or set KVPOOL_SECRET_FILE")
            })?;
            let key = match (role, tenant) {
                (_, Some(name)) => own.for_tenant(&name)?,
                (Some(role), None) => {
                    let role = kvpool_net::auth::Role::parse(&role).ok_or_else(|| {
                        anyhow::anyhow!("unknown role {role:?} (client, store, admin)")
                    })?;
                    own.derive(role).ok_or_else(|| {
                        anyhow::anyhow!("a {} key cannot derive the {role} key", own.role())
                    })?
                }
                (None, None) => anyhow::bail!("pass --role or --tenant"),
            };
            println!("{}", key.encode());
        }
    }
    Ok(ExitCode::SUCCESS)
}
