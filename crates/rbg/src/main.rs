//! The `rbg` binary: parses flags and dispatches to the library. Every
//! command prints one line and exits non-zero on error.

use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use rbg::planner::Backoff;
use rbg::runtime::control::{self, Request, Response};
use rbg::runtime::images::ImageMap;
use rbg::runtime::state::{default_state_dir, GroupDir, GroupStatus};

/// rbg: run RoleBasedGroups (workloads.x-k8s.io v1alpha1/v1alpha2) on this
/// machine, or reconcile them on Kubernetes (`rbg operator`).
#[derive(Parser, Debug)]
#[command(name = "rbg", version, about)]
struct Cli {
    /// State directory (default $XDG_RUNTIME_DIR/rbg or /tmp/rbg-$UID).
    #[arg(long, env = "RBG_STATE_DIR", global = true)]
    state_dir: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run a group in the foreground (Ctrl-C stops it in reverse dependency order).
    Up(UpArgs),
    /// Change a running group to a new spec.
    Apply(ApplyArgs),
    /// Show roles and instances of a running group.
    Status(StatusArgs),
    /// Print the log of an instance (g-r-i).
    Logs(LogsArgs),
    /// Revision history and rollback.
    Rollout {
        #[command(subcommand)]
        command: RolloutCommand,
    },
    /// Stop a running group.
    Down(GroupArg),
    /// Check a spec file: errors, unknown and unsupported fields (each
    /// with its path), levels, revisions.
    Validate(ValidateArgs),
    /// Print a v1alpha1 file in v1alpha2 (groups plus CoordinatedPolicies).
    Convert(FileArg),
    /// Print the CustomResourceDefinitions of the operator.
    Crd,
    /// Run the Kubernetes controller (in a cluster or with a kubeconfig).
    Operator(rbg::operator::Options),
}

#[derive(Args, Debug)]
struct ValidateArgs {
    #[command(flatten)]
    file: FileArg,
    /// Fail on unknown fields (in neither rbg's nor upstream's schema, a
    /// misspelt one for example), as `kubectl --validate=strict` does;
    /// fields rbg does not support stay warnings.
    #[arg(long)]
    strict: bool,
}

#[derive(Args, Debug)]
struct FileArg {
    /// The RoleBasedGroup YAML file ("-" for stdin).
    #[arg(short = 'f', long = "filename")]
    file: PathBuf,
}

#[derive(Args, Debug)]
struct GroupArg {
    /// Group name (default: the only running group).
    #[arg(short = 'g', long)]
    group: Option<String>,
}

#[derive(Args, Debug)]
struct UpArgs {
    #[command(flatten)]
    file: FileArg,
    /// Image map file (image -> directory | {dir, prefix, entrypoint}).
    #[arg(long, env = "RBG_IMAGES")]
    images: Option<PathBuf>,
    /// Delay before the first crash restart; doubles per consecutive crash.
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    backoff_base: Duration,
    /// Largest crash restart delay.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    backoff_max: Duration,
    /// Upper bound on the stop grace of any container.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    max_grace: Duration,
}

#[derive(Args, Debug)]
struct ApplyArgs {
    #[command(flatten)]
    file: FileArg,
    /// Replace the image map with this file.
    #[arg(long, env = "RBG_IMAGES")]
    images: Option<PathBuf>,
    /// Wait until every role is updated and ready.
    #[arg(long)]
    wait: bool,
    /// How long --wait waits.
    #[arg(long, default_value = "300s", value_parser = humantime::parse_duration)]
    timeout: Duration,
}

#[derive(Args, Debug)]
struct StatusArgs {
    #[command(flatten)]
    group: GroupArg,
    /// Print JSON instead of a table (same as `-o json`).
    #[arg(long)]
    json: bool,
    /// Output: `table`, `json` (rbg's full status) or `yaml` (the group
    /// object with its status as upstream reports it).
    #[arg(short = 'o', long, default_value = "table")]
    output: String,
}

#[derive(Args, Debug)]
struct LogsArgs {
    /// Instance name, e.g. demo-store-0.
    instance: String,
    /// Container (default: the only one).
    #[arg(short = 'c', long)]
    container: Option<String>,
    /// Keep printing new output.
    #[arg(short = 'f', long)]
    follow: bool,
    /// Only the last N lines.
    #[arg(long)]
    tail: Option<usize>,
}

#[derive(Subcommand, Debug)]
enum RolloutCommand {
    /// List applied revisions.
    History {
        #[command(flatten)]
        group: GroupArg,
        #[command(flatten)]
        cluster: rbg::operator::history::ClusterArgs,
    },
    /// Go back to an earlier revision (the previous one by default).
    Undo {
        #[command(flatten)]
        group: GroupArg,
        /// History number to return to.
        #[arg(long)]
        to_revision: Option<u64>,
        #[command(flatten)]
        cluster: rbg::operator::history::ClusterArgs,
    },
}

fn main() {
    let cli = Cli::parse();
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("rbg: starting the runtime: {e}");
            std::process::exit(1);
        }
    };
    if let Err(e) = rt.block_on(dispatch(cli)) {
        eprintln!("rbg: {e:#}");
        std::process::exit(1);
    }
}

fn read_spec(path: &Path) -> Result<String> {
    if path == Path::new("-") {
        let mut s = String::new();
        std::io::stdin()
            .read_to_string(&mut s)
            .context("reading stdin")?;
        return Ok(s);
    }
    std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))
}

/// Loads every group of a file, naming the file in any error.
fn load(path: &Path) -> Result<(String, rbg::spec::Bundle)> {
    let text = read_spec(path)?;
    let bundle = rbg::spec::load_all(&text).map_err(|e| anyhow!("{}: {e}", path.display()))?;
    if bundle.groups.is_empty() {
        bail!(
            "{}: the file holds no RoleBasedGroup (kind RoleBasedGroup or RoleBasedGroupSet)",
            path.display()
        );
    }
    Ok((text, bundle))
}

async fn dispatch(cli: Cli) -> Result<()> {
    let state = cli.state_dir.clone().unwrap_or_else(default_state_dir);
    match cli.command {
        Command::Up(a) => up(&state, a).await,
        Command::Apply(a) => apply(&state, a).await,
        Command::Status(a) => status(&state, a).await,
        Command::Logs(a) => logs(&state, a),
        Command::Rollout { command } => rollout(&state, command).await,
        Command::Down(g) => down(&state, g).await,
        Command::Validate(a) => validate(&a.file.file, a.strict),
        Command::Convert(f) => convert(&f.file),
        Command::Crd => {
            print!("{}", rbg::operator::crd_yaml()?);
            Ok(())
        }
        Command::Operator(a) => rbg::operator::run(a).await,
    }
}

fn images(path: Option<&Path>) -> Result<Option<ImageMap>> {
    path.map(|p| ImageMap::load(p).map_err(|e| anyhow!("{e}")))
        .transpose()
}

async fn up(state: &Path, a: UpArgs) -> Result<()> {
    let (text, bundle) = load(&a.file.file)?;
    let names: Vec<String> = bundle.groups.iter().map(|l| l.group.name.clone()).collect();
    let image_map = images(a.images.as_deref())?;
    let many = names.len() > 1;
    let opts = |name: &str| {
        let mut opts = rbg::runtime::Options::new(state.to_path_buf());
        if let Some(m) = &image_map {
            opts.images = m.clone();
        }
        let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        opts.backoff = Backoff {
            base_ms: ms(a.backoff_base),
            max_ms: ms(a.backoff_max),
        };
        opts.max_grace = a.max_grace;
        // Several groups share the terminal: prefix each line with its group.
        let prefix = if many {
            format!("{name}: ")
        } else {
            String::new()
        };
        opts.report = Box::new(move |line| {
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "{prefix}{line}");
            let _ = out.flush();
        });
        opts
    };
    if !many {
        rbg::runtime::run(&text, None, opts(&names[0])).await?;
        return Ok(());
    }
    // Every group of the file (a RoleBasedGroupSet gives several) runs
    // under its own supervisor and control socket, on this one thread.
    let runs = names
        .iter()
        .map(|n| rbg::runtime::run(&text, Some(n.as_str()), opts(n)));
    let mut failed = Vec::new();
    for (n, r) in names.iter().zip(futures::future::join_all(runs).await) {
        if let Err(e) = r {
            failed.push(format!("group {n}: {e}"));
        }
    }
    if !failed.is_empty() {
        bail!("{}", failed.join("; "));
    }
    Ok(())
}

/// The group to talk to: the one named, or the only one running.
async fn pick_group(state: &Path, group: Option<&str>) -> Result<GroupDir> {
    if let Some(g) = group {
        return Ok(GroupDir::new(state, g));
    }
    let mut running = Vec::new();
    if let Ok(entries) = std::fs::read_dir(state) {
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let dir = GroupDir::new(state, &name);
            if control::is_live(&dir.socket()).await {
                running.push(dir);
            }
        }
    }
    match running.len() {
        0 => bail!("no group is running in {}", state.display()),
        1 => Ok(running.remove(0)),
        _ => bail!(
            "several groups are running ({}); pick one with -g",
            running
                .iter()
                .map(|d| d.group.clone())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

async fn call(dir: &GroupDir, req: &Request, timeout: Duration) -> Result<Response> {
    let resp = control::call(&dir.socket(), req, timeout)
        .await
        .map_err(|e| anyhow!("group {:?}: {e}", dir.group))?;
    if let Response::Error { message } = &resp {
        bail!("{message}");
    }
    Ok(resp)
}

async fn fetch_status(dir: &GroupDir) -> Result<GroupStatus> {
    match call(dir, &Request::Status, Duration::from_secs(10)).await? {
        Response::Status { status } => Ok(status),
        other => bail!("unexpected answer {other:?}"),
    }
}

async fn apply(state: &Path, a: ApplyArgs) -> Result<()> {
    let (text, bundle) = load(&a.file.file)?;
    for loaded in &bundle.groups {
        apply_one(state, &a, &text, &loaded.group.name).await?;
    }
    Ok(())
}

async fn apply_one(state: &Path, a: &ApplyArgs, text: &str, name: &str) -> Result<()> {
    let dir = GroupDir::new(state, name);
    let req = Request::Apply {
        spec: text.to_string(),
        images: images(a.images.as_deref())?,
    };
    let Response::Applied {
        generation,
        changed,
        unimplemented,
    } = call(&dir, &req, Duration::from_secs(30)).await?
    else {
        bail!("unexpected answer");
    };
    for u in &unimplemented {
        eprintln!("warning: {u}");
    }
    if changed.is_empty() {
        println!("group {}: unchanged (revision {generation})", dir.group);
    } else {
        println!("group {}: revision {generation}", dir.group);
        for c in &changed {
            println!("  {c}");
        }
    }
    if a.wait {
        wait_rolled_out(&dir, a.timeout).await?;
    }
    Ok(())
}

/// Waits until every role has all replicas updated and ready.
async fn wait_rolled_out(dir: &GroupDir, timeout: Duration) -> Result<()> {
    let start = Instant::now();
    let mut last = String::new();
    loop {
        let s = fetch_status(dir).await?;
        let line = s
            .roles
            .iter()
            .map(|r| {
                format!(
                    "{} {}/{} ready {}/{} updated",
                    r.name, r.ready_replicas, r.replicas, r.updated_replicas, r.replicas
                )
            })
            .collect::<Vec<_>>()
            .join(", ");
        if line != last {
            println!("  {line}");
            last = line;
        }
        let done = s.ready
            && s.roles.iter().all(|r| r.updated_replicas == r.replicas)
            && s.instances.iter().all(|i| i.state == "Running");
        if done {
            println!("group {} is Ready", s.name);
            return Ok(());
        }
        if start.elapsed() > timeout {
            bail!("group {} not rolled out after {timeout:?}", s.name);
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

fn age(secs: u64) -> String {
    match secs {
        s if s < 60 => format!("{s}s"),
        s if s < 3600 => format!("{}m{}s", s / 60, s % 60),
        s if s < 86400 => format!("{}h{}m", s / 3600, (s % 3600) / 60),
        s => format!("{}d{}h", s / 86400, (s % 86400) / 3600),
    }
}

/// The `rbg status` table.
fn format_status(s: &GroupStatus) -> String {
    let mut out = format!(
        "GROUP {}  {}  revision {}{}\n",
        s.name,
        if s.ready { "Ready" } else { "NotReady" },
        s.generation,
        if s.group_restarts > 0 {
            format!("  group restarts {}", s.group_restarts)
        } else {
            String::new()
        }
    );
    for r in &s.roles {
        out.push_str(&format!(
            "  level {} {:<12} {}/{} ready  {}/{} updated  revision {}{}\n",
            r.level,
            r.name,
            r.ready_replicas,
            r.replicas,
            r.updated_replicas,
            r.replicas,
            r.revision,
            r.waiting
                .as_ref()
                .map(|w| format!("  ({w})"))
                .unwrap_or_default()
        ));
    }
    out.push('\n');
    let width = s
        .instances
        .iter()
        .map(|i| i.name.len())
        .max()
        .unwrap_or(8)
        .max(8);
    // One format for the header and the rows keeps the columns aligned.
    let row = |[role, name, address, ready, revision, restarts, age, state]: [&str; 8]| {
        format!(
            "{role:<12} {name:<width$} {address:<15} {ready:<6} {revision:<10} {restarts:>8} {age:>7}  {state}\n"
        )
    };
    out.push_str(&row([
        "ROLE", "INSTANCE", "ADDRESS", "READY", "REVISION", "RESTARTS", "AGE", "STATE",
    ]));
    for i in &s.instances {
        out.push_str(&row([
            &i.role,
            &i.name,
            &i.address,
            if i.ready { "true" } else { "false" },
            &i.revision,
            &i.restarts.to_string(),
            &age(i.age_secs),
            &i.state,
        ]));
    }
    out
}

async fn status(state: &Path, a: StatusArgs) -> Result<()> {
    let dir = pick_group(state, a.group.group.as_deref()).await?;
    let s = fetch_status(&dir).await?;
    let output = if a.json { "json" } else { a.output.as_str() };
    match output {
        "json" => println!("{}", serde_json::to_string_pretty(&s)?),
        "yaml" => print!("{}", serde_yaml::to_string(&upstream_object(&s))?),
        "table" | "wide" => print!("{}", format_status(&s)),
        o => bail!("-o {o:?}: use table, json or yaml"),
    }
    Ok(())
}

async fn down(state: &Path, g: GroupArg) -> Result<()> {
    let dir = pick_group(state, g.group.as_deref()).await?;
    call(&dir, &Request::Down, Duration::from_secs(600)).await?;
    println!("group {} stopped", dir.group);
    Ok(())
}

async fn rollout(state: &Path, c: RolloutCommand) -> Result<()> {
    match c {
        RolloutCommand::History { group, cluster } if cluster.cluster => {
            let name = group.group.context("--cluster needs -g GROUP")?;
            let (client, ns) = cluster.connect().await?;
            let entries = rbg::operator::history::entries(&client, &ns, &name).await?;
            print!("{}", rbg::operator::history::table(&entries));
            Ok(())
        }
        RolloutCommand::Undo {
            group,
            to_revision,
            cluster,
        } if cluster.cluster => {
            let name = group.group.context("--cluster needs -g GROUP")?;
            let (client, ns) = cluster.connect().await?;
            let to = to_revision.map(i64::try_from).transpose()?;
            let n = rbg::operator::history::undo(&client, &ns, &name, to).await?;
            println!("group {ns}/{name}: spec set back to revision {n}; the operator rolls it out");
            Ok(())
        }
        RolloutCommand::History { group: g, .. } => {
            let dir = pick_group(state, g.group.as_deref()).await?;
            let Response::History { entries } =
                call(&dir, &Request::History, Duration::from_secs(10)).await?
            else {
                bail!("unexpected answer");
            };
            println!("{:<9} {:<25} {:<16} ROLES", "REVISION", "APPLIED", "CAUSE");
            for e in entries {
                let when = humantime::format_rfc3339_seconds(
                    std::time::UNIX_EPOCH + Duration::from_secs(e.applied_at),
                );
                let roles = e
                    .revisions
                    .iter()
                    .map(|(r, v)| format!("{r}={v}"))
                    .collect::<Vec<_>>()
                    .join(" ");
                println!(
                    "{:<9} {:<25} {:<16} {roles}",
                    e.number,
                    when.to_string(),
                    e.cause
                );
            }
            Ok(())
        }
        RolloutCommand::Undo {
            group, to_revision, ..
        } => {
            let dir = pick_group(state, group.group.as_deref()).await?;
            let resp = call(
                &dir,
                &Request::Undo { to: to_revision },
                Duration::from_secs(30),
            )
            .await?;
            if let Response::Applied {
                generation,
                changed,
                ..
            } = resp
            {
                println!("group {}: rolled back, revision {generation}", dir.group);
                for c in changed {
                    println!("  {c}");
                }
            }
            Ok(())
        }
    }
}

/// Finds the log file of an instance in any group of the state dir.
fn find_log(state: &Path, instance: &str, container: Option<&str>) -> Result<PathBuf> {
    let entries =
        std::fs::read_dir(state).with_context(|| format!("reading {}", state.display()))?;
    for e in entries.flatten() {
        let dir = GroupDir::new(state, &e.file_name().to_string_lossy());
        let idir = dir.instance(instance);
        if !idir.is_dir() {
            continue;
        }
        if let Some(c) = container {
            let p = dir.log(instance, c);
            if p.is_file() {
                return Ok(p);
            }
            bail!("instance {instance} has no container {c:?}");
        }
        let mut logs: Vec<PathBuf> = std::fs::read_dir(&idir)?
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "log"))
            .collect();
        logs.sort();
        return match logs.len() {
            0 => bail!("instance {instance} has no logs yet"),
            1 => Ok(logs.remove(0)),
            _ => bail!(
                "instance {instance} has several containers ({}); pick one with -c",
                logs.iter()
                    .filter_map(|p| p.file_stem().map(|s| s.to_string_lossy().into_owned()))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        };
    }
    bail!("no instance {instance} in {}", state.display())
}

fn logs(state: &Path, a: LogsArgs) -> Result<()> {
    let path = find_log(state, &a.instance, a.container.as_deref())?;
    let mut f =
        std::fs::File::open(&path).with_context(|| format!("opening {}", path.display()))?;
    let mut text = Vec::new();
    f.read_to_end(&mut text)?;
    let mut out = std::io::stdout().lock();
    match a.tail {
        Some(n) => {
            let s = String::from_utf8_lossy(&text);
            let lines: Vec<&str> = s.lines().collect();
            for l in &lines[lines.len().saturating_sub(n)..] {
                writeln!(out, "{l}")?;
            }
        }
        None => out.write_all(&text)?,
    }
    out.flush()?;
    if !a.follow {
        return Ok(());
    }
    let mut pos = f.stream_position()?;
    loop {
        std::thread::sleep(Duration::from_millis(200));
        let len = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
        if len < pos {
            pos = 0; // truncated or recreated
        }
        if len > pos {
            let mut f = std::fs::File::open(&path)?;
            f.seek(SeekFrom::Start(pos))?;
            let mut buf = Vec::new();
            f.read_to_end(&mut buf)?;
            pos += buf.len() as u64;
            out.write_all(&buf)?;
            out.flush()?;
        }
    }
}

/// The group object as `kubectl get rbg -o yaml` shows it upstream:
/// apiVersion, kind, metadata and the upstream-shaped status.
fn upstream_object(s: &GroupStatus) -> serde_json::Value {
    let api = if s.api_version.is_empty() {
        rbg::spec::API_V1ALPHA2
    } else {
        s.api_version.as_str()
    };
    serde_json::json!({
        "apiVersion": api,
        "kind": rbg::spec::KIND,
        "metadata": {
            "name": s.name,
            "namespace": if s.namespace.is_empty() { "default" } else { s.namespace.as_str() },
            "generation": s.generation,
        },
        "status": s.upstream,
    })
}

fn convert(path: &Path) -> Result<()> {
    let text = read_spec(path)?;
    print!(
        "{}",
        rbg::spec::convert::convert_file(&text).map_err(|e| anyhow!("{}: {e}", path.display()))?
    );
    Ok(())
}

fn validate(path: &Path, strict: bool) -> Result<()> {
    let (_, bundle) = load(path)?;
    for n in &bundle.notes {
        println!("note: {n}");
    }
    for f in &bundle.fields {
        println!("warning: {f}");
    }
    for loaded in &bundle.groups {
        validate_one(loaded);
    }
    let unknown: Vec<&str> = bundle
        .all_fields()
        .filter(|f| f.is_unknown())
        .map(|f| f.path.as_str())
        .collect();
    if strict && !unknown.is_empty() {
        bail!(
            "{}: {} unknown field(s) (--strict): {}",
            path.display(),
            unknown.len(),
            unknown.join(", ")
        );
    }
    Ok(())
}

fn validate_one(loaded: &rbg::spec::Loaded) {
    if let Err(m) = rbg::runtime::supervisor::check_local_limits(&loaded.group) {
        println!("local runtime: {m}");
    }
    for u in &loaded.unimplemented {
        println!("warning: {u}");
    }
    let g = &loaded.group;
    println!("group {} ({}) is valid", g.name, loaded.api_version);
    for (i, level) in rbg::planner::group_levels(g).iter().enumerate() {
        println!("  level {i}: {}", level.join(", "));
    }
    for r in &g.roles {
        let pattern = match r.pattern {
            rbg::spec::Pattern::Standalone => "standalone".to_string(),
            rbg::spec::Pattern::LeaderWorker { size } => format!("leader-worker x{size}"),
            rbg::spec::Pattern::CustomComponents => format!("{} components Pods", r.pods.len()),
        };
        println!(
            "  role {:<12} replicas {:<3} revision {}  {pattern}",
            r.name,
            r.replicas,
            rbg::revision::role_revision(r)
        );
    }
    for c in &g.coordination {
        println!("  coordination {} over {}", c.name, c.roles.join(", "));
    }
}
