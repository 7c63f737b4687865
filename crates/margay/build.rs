//! Records the commit the binary is built from, for `margay --version` (Calico's binaries print
//! their git commit the same way). A build outside a git checkout says `unknown`.

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let s = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (!s.is_empty()).then_some(s)
}

fn main() {
    let commit = git(&["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".into());
    // The commit's date, not the build's: two builds of one commit print the same version.
    let date = git(&["log", "-1", "--format=%cs"]).unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=MARGAY_GIT_COMMIT={commit}");
    println!("cargo:rustc-env=MARGAY_COMMIT_DATE={date}");
    // Rebuild when HEAD moves (a commit, a checkout); worktrees keep HEAD in their own git dir.
    if let Some(dir) = git(&["rev-parse", "--git-dir"]) {
        println!("cargo:rerun-if-changed={dir}/HEAD");
        if let (Some(branch), Some(common)) = (
            git(&["symbolic-ref", "-q", "HEAD"]),
            git(&["rev-parse", "--git-common-dir"]),
        ) {
            println!("cargo:rerun-if-changed={common}/{branch}");
            println!("cargo:rerun-if-changed={common}/packed-refs");
        }
    }
    println!("cargo:rerun-if-changed=build.rs");
}
