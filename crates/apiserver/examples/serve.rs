//! Runs the API server double until stdin closes or a line is read; writes a kubeconfig.
//!
//! `cargo run -p margay-apiserver --example serve -- KUBECONFIG [--calico] [--plain] [FIXTURE.yaml…]`
#![allow(clippy::unwrap_used)]

use margay_apiserver::{ServerOptions, run_until};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(kubeconfig) = args.first().cloned() else {
        eprintln!("usage: serve KUBECONFIG [--calico] [--plain] [FIXTURE.yaml...]");
        std::process::exit(2);
    };
    let opts = ServerOptions {
        calico_crds: args.iter().any(|a| a == "--calico"),
        tls: !args.iter().any(|a| a == "--plain"),
        ..Default::default()
    };
    let fixtures: Vec<String> = args[1..]
        .iter()
        .filter(|a| !a.starts_with("--"))
        .cloned()
        .collect();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(run_until(
        opts,
        |s| {
            s.write_kubeconfig(std::path::Path::new(&kubeconfig))
                .map_err(|e| margay_apiserver::Error::Load(e.to_string()))?;
            for f in &fixtures {
                let text = std::fs::read_to_string(f)
                    .map_err(|e| margay_apiserver::Error::Load(e.to_string()))?;
                s.store().load(&text)?;
            }
            println!(
                "serving {} (kubeconfig {kubeconfig}); press Enter to stop",
                s.url()
            );
            Ok(())
        },
        async {
            let _ = tokio::task::spawn_blocking(|| {
                let mut line = String::new();
                let _ = std::io::stdin().read_line(&mut line);
            })
            .await;
        },
    ))
    .unwrap();
}
