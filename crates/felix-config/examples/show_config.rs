//! Prints `margay felix config` output for a sample set of inputs (a development aid).
use margay_felix_config::{ConfigInputs, load};

fn main() {
    let mut inputs = ConfigInputs {
        hostname: Some("node-1".into()),
        config_file: Some("[global]\nLogSeverityScreen = debug\nFelixHostname=\n".into()),
        ..ConfigInputs::default()
    };
    inputs.env.insert("FELIX_BPFENABLED".into(), "true".into());
    inputs
        .env
        .insert("FELIX_HEALTHENABLED".into(), "yes".into());
    inputs.env.insert("FELIX_MYSTERY".into(), "42".into());
    inputs
        .env
        .insert("FELIX_ROUTEREFRESHINTERVAL".into(), "-3".into());
    match load(&inputs) {
        Ok(l) => print!(
            "{}",
            l.render_table(std::env::args().any(|a| a == "--only-set"))
        ),
        Err(e) => eprintln!("fatal: {e}"),
    }
}
