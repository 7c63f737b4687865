//! Shell completions and man pages, generated from the same clap definitions the binary parses
//! with, so they never drift from the real flags.

use std::io::{self, Write};
use std::path::{Path, PathBuf};

use clap::Command;

/// Roles that run as daemons or system services: their pages go in section 8, the rest in 1.
const SECTION_8: &[&str] = &["node", "felix", "typha", "confd", "kube-controllers"];

/// Writes the completion script for `shell` to `out`. A reader that goes away early (`| head`)
/// is not an error.
pub fn completion(
    mut cmd: Command,
    shell: clap_complete::Shell,
    out: &mut dyn Write,
) -> io::Result<()> {
    let name = cmd.get_name().to_string();
    // clap_complete panics when its writer fails: generate into memory, then write.
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut cmd, name, &mut script);
    match out.write_all(&script).and_then(|()| out.flush()) {
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Ok(()),
        other => other,
    }
}

/// Writes one man page per command and subcommand into `dir` (`margay.1`, `margay-ctl.1`,
/// `margay-felix.8`, `margay-ctl-get.1`, …). Returns the files written.
pub fn man_pages(cmd: Command, dir: &Path) -> io::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!(
                "cannot create {}: {e} (choose a writable --dir)",
                dir.display()
            ),
        )
    })?;
    let mut cmd = cmd;
    // Subcommands carry their parent's version and globals only once built.
    cmd.build();
    let mut written = Vec::new();
    write_pages(&cmd, cmd.get_name(), "1", true, dir, &mut written)?;
    Ok(written)
}

fn write_pages(
    cmd: &Command,
    page_name: &str,
    section: &str,
    top: bool,
    dir: &Path,
    written: &mut Vec<PathBuf>,
) -> io::Result<()> {
    // clap names are `&'static str` (its `string` feature would rebuild every crate using
    // clap); a man run writes ~100 pages and exits, so leaking the names is harmless.
    let static_name: &'static str = Box::leak(page_name.to_string().into_boxed_str());
    let named = cmd.clone().name(static_name);
    let path = dir.join(format!("{page_name}.{section}"));
    let mut buf = Vec::new();
    clap_mangen::Man::new(named)
        .section(section)
        .manual("margay")
        .render(&mut buf)?;
    std::fs::write(&path, buf)
        .map_err(|e| io::Error::new(e.kind(), format!("cannot write {}: {e}", path.display())))?;
    written.push(path);
    for sub in cmd.get_subcommands() {
        if sub.is_hide_set() || sub.get_name() == "help" {
            continue;
        }
        // A role's section is decided at the top; its own subcommands stay with it.
        let sub_section = if top && SECTION_8.contains(&sub.get_name()) {
            "8"
        } else {
            section
        };
        write_pages(
            sub,
            &format!("{page_name}-{}", sub.get_name()),
            sub_section,
            false,
            dir,
            written,
        )?;
    }
    Ok(())
}
