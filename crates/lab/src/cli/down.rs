//! `lab down`: every process and namespace of the lab removed.

use super::*;

pub(super) fn down(which: &Which, out: &mut dyn Write) -> Result<u8, LabError> {
    check_name(&which.name).map_err(other)?;
    let dir = which.dir();
    let prefix = match LabState::load(&dir) {
        Ok(st) => {
            for pid_file in st.pid_files() {
                net::kill_pid_file(&pid_file);
            }
            st.prefix
        }
        Err(_) => format!("mgy-{}-", which.name),
    };
    // Anything still running with the lab's directory in its command line.
    let needle = dir.display().to_string();
    net::kill_where(|pid| {
        std::fs::read(format!("/proc/{pid}/cmdline"))
            .map(|c| String::from_utf8_lossy(&c).contains(needle.as_str()))
            .unwrap_or(false)
    });
    let namespaces = net::netns_with_prefix(&prefix);
    let failed = net::remove_netns(&namespaces);
    let _ = std::fs::remove_dir_all(&dir);
    let _ = writeln!(
        out,
        "lab {:?} removed ({} namespaces)",
        which.name,
        namespaces.len() - failed.len()
    );
    if failed.is_empty() {
        Ok(0)
    } else {
        Err(other(format!(
            "could not delete namespaces {failed:?}; remove them with `ip netns delete NAME`"
        )))
    }
}
