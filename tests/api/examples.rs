//! The examples of `examples/` run end to end by `scripts/examples.sh`: each against the release
//! server (the binary named by `LOUPE_UI_BIN`) on a fresh SQLite file and the local fake provider
//! (`examples/fake_provider.py`), which refuses any request its provider would refuse. The script
//! checks what each example must show: a multi-turn tool loop, a crash between a tool call and
//! its result that the next run survives, zoom and search answered from Loupe, and every request
//! valid; a change to the API that breaks an example fails here.
//!
//! Skipped, with the reason printed, when `LOUPE_UI_BIN` is not set (`.ci/run` sets it after the
//! release build) or when python3, node or npm is missing.

use std::path::Path;
use std::process::Command;

fn on_path(program: &str) -> bool {
    std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
        .any(|dir| dir.join(program).is_file())
}

#[test]
fn every_example_runs_its_loop_against_the_fake_provider() {
    let Some(binary) = std::env::var("LOUPE_UI_BIN").ok().filter(|b| !b.is_empty()) else {
        println!("SKIPPED the examples: LOUPE_UI_BIN is not set (.ci/run sets it after the release build)");
        return;
    };
    if let Some(missing) = ["python3", "node", "npm"].into_iter().find(|p| !on_path(p)) {
        println!("SKIPPED the examples: {missing} is not installed");
        return;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let output = Command::new("bash")
        .arg(root.join("scripts/examples.sh"))
        .arg(&binary)
        .current_dir(root)
        .output()
        .expect("bash runs scripts/examples.sh");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    println!("{stdout}");
    assert!(
        output.status.success(),
        "scripts/examples.sh {binary} failed ({}):\n{stdout}\n{stderr}",
        output.status
    );
    assert!(
        stdout.lines().any(|line| line == "examples: ok"),
        "scripts/examples.sh did not report success:\n{stdout}"
    );
}
