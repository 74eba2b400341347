//! The master's status page, opened in a real browser (headless Chromium,
//! Debian's `chromium`, which scripts/test.sh installs): a loaded pool's page
//! renders its role, segments, clients, chart and events, the browser's
//! console stays silent, and a screenshot is saved for a human to look at.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::Cluster;
use kvpool_client::ReplicateConfig;

/// The browser: `KVPOOL_CHROMIUM`, or `chromium` on the PATH.
fn chromium() -> PathBuf {
    if let Some(p) = std::env::var_os("KVPOOL_CHROMIUM") {
        return p.into();
    }
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join("chromium"))
        .find(|p| p.is_file())
        .expect("headless Chromium is needed: `apt-get install chromium` (scripts/test.sh installs it), or set KVPOOL_CHROMIUM")
}

/// Runs headless Chromium on `url` with `args`; its stdout and stderr.
async fn browse(profile: &Path, url: &str, args: &[&str]) -> (String, String) {
    let mut cmd = Command::new(chromium());
    cmd.args([
        "--headless=new",
        // The tests run as root in CI containers.
        "--no-sandbox",
        "--disable-gpu",
        "--no-first-run",
        "--window-size=1280,1000",
        // Lets the page's fetches finish before the DOM is taken.
        "--virtual-time-budget=5000",
        // Console messages go to stderr as `CONSOLE` lines.
        "--enable-logging=stderr",
        "--v=0",
    ])
    .arg(format!("--user-data-dir={}", profile.display()))
    .args(args)
    .arg(url);
    let out = tokio::time::timeout(
        Duration::from_secs(90),
        tokio::task::spawn_blocking(move || cmd.output()),
    )
    .await
    .expect("chromium finishes within 90 s")
    .expect("the blocking task runs")
    .expect("chromium starts");
    assert!(out.status.success(), "chromium failed: {out:?}");
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The text of the element with `id`'s opening tag through its closing one
/// (good enough for the tables and cards of this page).
fn section<'a>(dom: &'a str, id: &str) -> &'a str {
    let start = dom
        .find(&format!("id=\"{id}\""))
        .unwrap_or_else(|| panic!("no #{id} in the page:\n{dom}"));
    let rest = &dom[start..];
    &rest[..rest
        .find("</table>")
        .or(rest.find("</div>"))
        .unwrap_or(rest.len())]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_page_shows_a_loaded_pool_in_a_real_browser() {
    let cluster = Cluster::builder().stores(2).start().await;
    let client = cluster.client().await;
    for i in 0..300 {
        let key = format!("page/{i:04}");
        client
            .put(&key, &[i as u8; 2048], &ReplicateConfig::default())
            .await
            .expect("put");
    }
    for i in 0..400 {
        // A quarter of the reads miss.
        let _ = client.get(&format!("page/{:04}", i % 400)).await;
    }
    // Two samples (one every 5 s) make a line of the chart.
    let base = format!("http://{}", cluster.metrics_addr);
    common::eventually(
        "two samples of history",
        Duration::from_secs(20),
        async || {
            let (code, body) = common::http_get(&cluster.metrics_addr, "/api/history").await;
            let samples: Vec<serde_json::Value> = serde_json::from_str(&body).ok()?;
            (code == 200 && samples.len() >= 2).then_some(())
        },
    )
    .await;

    let profile = cluster.dir().join("chromium-profile");
    let (dom, log) = browse(&profile, &format!("{base}/"), &["--dump-dom"]).await;

    let console: Vec<&str> = log.lines().filter(|l| l.contains(":CONSOLE")).collect();
    assert!(
        console.is_empty(),
        "the page wrote to the browser console: {console:#?}"
    );
    assert!(
        dom.contains("data-loaded=\"true\""),
        "the page never finished loading its data:\n{dom}"
    );
    assert!(
        dom.contains("class=\"badge leader\">leader<"),
        "HA role badge"
    );
    // Cards: the keys written, the hit rate of reads where a quarter missed.
    let cards = section(&dom, "cards");
    assert!(cards.contains(">300<"), "keys card: {cards}");
    assert!(cards.contains(">75.0%<"), "hit rate card: {cards}");
    // Segments of both stores, with their tier and a fill bar.
    let segments = section(&dom, "segments");
    for i in 0..2 {
        assert!(
            segments.contains(&Cluster::store_name(i)),
            "segment of store {i}: {segments}"
        );
    }
    assert_eq!(segments.matches("class=\"bar\"").count(), 2, "{segments}");
    assert!(segments.contains("tier-memory"), "{segments}");
    // Both stores and the test's client are registered.
    let clients = section(&dom, "clients");
    assert_eq!(clients.matches("segment(s)").count(), 2, "{clients}");
    // The chart drew lines from the samples.
    assert!(
        section(&dom, "plot").contains("<polyline"),
        "no chart line:\n{dom}"
    );
    // The master's log shows up as events.
    assert!(
        section(&dom, "events").contains("segment mounted"),
        "events: {}",
        section(&dom, "events")
    );

    // A screenshot for a human, beside the build's other outputs.
    let shot = Path::new(env!("CARGO_TARGET_TMPDIR")).join("status-page.png");
    let _ = std::fs::remove_file(&shot);
    let arg = format!("--screenshot={}", shot.display());
    browse(&profile, &format!("{base}/"), &[&arg]).await;
    let png = std::fs::read(&shot).expect("the screenshot was saved");
    assert!(
        png.starts_with(b"\x89PNG") && png.len() > 10_000,
        "a real screenshot"
    );
    eprintln!("status page screenshot: {}", shot.display());
}
