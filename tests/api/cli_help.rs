//! The command line's help, as a person reads it: each subcommand lists only the flags it uses.
//! The append path's tuning (`--append-gather-us`, `--sqlite-synchronous`) is the server's alone.

use std::process::Command;

/// The long help of `loupe <args> --help`, from the built binary.
fn help(args: &[&str]) -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_loupe"))
        .args(args)
        .arg("--help")
        .output()
        .expect("run loupe --help");
    assert!(output.status.success(), "{args:?}: {output:?}");
    String::from_utf8(output.stdout).expect("UTF-8 help")
}

const SERVER_ONLY: [&str; 2] = ["--append-gather-us", "--sqlite-synchronous"];

#[test]
fn server_only_flags_are_in_the_servers_help_alone() {
    for serving in [&["serve"][..], &[]] {
        let text = help(serving);
        for flag in SERVER_ONLY {
            assert!(
                text.contains(flag),
                "loupe {serving:?} --help lacks {flag}:\n{text}"
            );
        }
    }
    for command in [
        &["import"][..],
        &["export"],
        &["migrate"],
        &["keys", "create"],
        &["keys", "list"],
        &["keys", "revoke"],
        &["tenants", "create"],
        &["tenants", "list"],
    ] {
        let text = help(command);
        // What they do use stays.
        assert!(
            text.contains("--database-url"),
            "loupe {command:?} --help:\n{text}"
        );
        for flag in SERVER_ONLY {
            assert!(
                !text.contains(flag),
                "loupe {command:?} --help lists {flag}:\n{text}"
            );
        }
    }
}
