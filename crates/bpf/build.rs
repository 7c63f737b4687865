//! Compiles the C programs under bpf/ with clang into OUT_DIR, where lib.rs embeds them.
use std::path::PathBuf;
use std::process::Command;

fn main() {
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let clang = std::env::var("MARGAY_BPF_CLANG").unwrap_or_else(|_| "clang".to_string());
    // One object today; later programs join this list.
    const PROGRAMS: &[&str] = &["policy"];
    for prog in PROGRAMS {
        let src = format!("bpf/{prog}.c");
        println!("cargo:rerun-if-changed={src}");
        let obj = out.join(format!("{prog}.o"));
        let result = Command::new(&clang)
            .args(["-O2", "-g", "-Wall", "-Werror", "-target", "bpf"])
            // v3: 32-bit atomics (conntrack flags), jmp32; kernels since 5.1.
            .arg("-mcpu=v3")
            .args(["-I/usr/include/x86_64-linux-gnu", "-c", &src, "-o"])
            .arg(&obj)
            .output();
        match result {
            Err(e) => panic!(
                "cannot run {clang} to compile {src} ({e}): run scripts/setup (installs clang and libbpf-dev)"
            ),
            Ok(o) if !o.status.success() => panic!(
                "{clang} failed on {src}:\n{}\n(if headers are missing: run scripts/setup (installs clang and libbpf-dev))",
                String::from_utf8_lossy(&o.stderr)
            ),
            Ok(_) => {}
        }
    }
    // Headers policy.c includes.
    println!("cargo:rerun-if-changed=bpf/svc.h");
    println!("cargo:rerun-if-env-changed=MARGAY_BPF_CLANG");
}
